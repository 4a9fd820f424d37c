"""Random-weight GGUF models of real architectures, written in seconds: the compute and the
tokenizer of a real model without its knowledge (the tests' model fixtures, the benchmarks'
realistic sizes). ``python -m bench.<module>`` runs each writer."""
