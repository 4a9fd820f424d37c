#pragma once

// A sequence state restored in two steps (Arbor): staged on the thread that calls llama_decode, written on any
// thread while llama_decode computes other sequences. Defined in llama-state-staged.cpp; Arbor's server binds it by
// symbol (server/engine/staged_state.py), so llama.h is not changed.
//
// llama_state_seq_set_data_ext already works in these two steps inside one call: it reads the state's metadata into
// the KV cache (the sequence's cells freed, new cells found, positions and sequence ids set, every check made) and
// only records each tensor range to copy, then copies them all when it returns. Staging keeps that record instead:
//
//   - llama_state_seq_stage: the first step, on the decode thread, for a plain unified KV cache (no sliding-window
//     or recurrent state, flags 0). The sequence's cells exist afterwards with their positions, but hold stale data.
//     NULL when the state does not fit or does not match the cache (the cells it took are freed again, as a refused
//     llama_state_seq_set_data leaves them), *n_read then 0.
//   - llama_state_staged_write: the copies (ggml_backend_tensor_set), once, on any thread. `src` must stay valid
//     and unchanged until it returns.
//   - llama_state_staged_free: after the write (or instead of it: the cells then hold stale data, and the caller
//     must remove the sequence's cells itself).
//
// Until the write has returned the caller keeps the sequence out of every batch and every other call on its cells
// (seq_cp from it, seq_rm, state reads, paged defragmentation), and keeps the cache from moving cells. Another
// sequence's attention may be computed meanwhile only by kernels that never read the K or V of a cell masked in all
// of their rows: the CPU's flash-attention kernels do (ggml-cpu ops.cpp; the tiled path zeroes such columns
// instead of loading them); llama.cpp's attention without flash attention does not.

// A sequence state read in two steps (Arbor), the mirror of the above, for writing KV back to host memory:
//
//   - llama_state_seq_snapshot: the first step of llama_state_seq_get_data, on the decode thread: llama.cpp's own
//     state writer runs (llama_memory_i::state_write) with a writer that keeps the metadata it writes (cell
//     positions, sequence ids, the layers' types and sizes) and only records each tensor range to copy. NULL when
//     the sequence's state cannot be written (the same cases llama_state_seq_get_data returns 0 for).
//   - llama_state_snapshot_size: the state's size, llama_state_seq_get_size's.
//   - llama_state_snapshot_read: the copies (ggml_backend_tensor_get) into `dst`, on any thread: the bytes are
//     those llama_state_seq_get_data writes, in the same order. Returns the bytes written, 0 when `size` is short.
//   - llama_state_snapshot_free.
//
// Until the read has returned the caller keeps the sequence's cells as they are: no seq_rm of the sequence, no
// batch that writes them, no paged defragmentation or other move of cells. Other sequences may be computed
// meanwhile: llama_decode writes only the cells of the batch's own tokens, never cells another sequence holds.

#include "llama.h"

#ifdef __cplusplus
extern "C" {
#endif

struct llama_state_staged;

LLAMA_API struct llama_state_staged * llama_state_seq_stage(struct llama_context * ctx, const uint8_t * src,
                                                            size_t size, llama_seq_id seq_id, size_t * n_read);
// the bytes the write copies (the state's K and V ranges)
LLAMA_API size_t llama_state_staged_n_bytes(const struct llama_state_staged * staged);
// 0 written; -1 already written
LLAMA_API int32_t llama_state_staged_write(struct llama_state_staged * staged);
LLAMA_API void    llama_state_staged_free(struct llama_state_staged * staged);

struct llama_state_snapshot;

LLAMA_API struct llama_state_snapshot * llama_state_seq_snapshot(struct llama_context * ctx, llama_seq_id seq_id);
LLAMA_API size_t llama_state_snapshot_size(const struct llama_state_snapshot * snap);
LLAMA_API size_t llama_state_snapshot_read(const struct llama_state_snapshot * snap, uint8_t * dst, size_t size);
LLAMA_API void   llama_state_snapshot_free(struct llama_state_snapshot * snap);

#ifdef __cplusplus
}
#endif
