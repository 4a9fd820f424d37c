"""llama-server's own endpoints: the native `POST /completion` (its request, its answer, whole
and streamed) and the bodies of `/tokenize`, `/detokenize` and `/apply-template`."""
