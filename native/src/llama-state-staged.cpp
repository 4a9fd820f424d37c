// A sequence state restored, or read, in two steps (Arbor): the contract is in llama-state-staged.h.

#include "llama-state-staged.h"

#include "llama-context.h"
#include "llama-impl.h"
#include "llama-io.h"
#include "llama-memory.h"

#include "ggml-backend.h"

#include <cstring>
#include <stdexcept>
#include <vector>

namespace {

// the magic llama_context writes at the head of a sequence state (io_magic, llama-context.cpp)
constexpr uint32_t STATE_SEQ_MAGIC = 0xaf143cd8;

struct tensor_write {
    ggml_tensor   * tensor;
    const uint8_t * src;
    size_t          offset;
    size_t          size;
};

// llama_io_read_host's reading, keeping the tensor ranges it records instead of copying them when it goes
class staging_reader : public llama_io_read_i {
public:
    staging_reader(const uint8_t * p, size_t len) : ptr(p), left(len) {}

    void read(void * dst, size_t size) override {
        memcpy(dst, take(size), size);
    }

    void read_tensor(ggml_tensor * tensor, size_t offset, size_t size) override {
        const uint8_t * src = take(size);
        writes.push_back({tensor, src, offset, size});
        n_write += size;
    }

    void discard() override {
        writes.clear();
        n_write = 0;
    }

    size_t n_bytes() override {
        return n_read;
    }

    std::vector<tensor_write> writes;
    size_t n_write = 0;

private:
    const uint8_t * take(size_t size) {
        if (size > left) {
            throw std::runtime_error("unexpectedly reached end of buffer");
        }
        const uint8_t * at = ptr;
        ptr    += size;
        left   -= size;
        n_read += size;
        return at;
    }

    const uint8_t * ptr;
    size_t left;
    size_t n_read = 0;
};

// one piece of a state, in the order llama_io_write_host would write it: metadata bytes kept here, or a tensor range
// copied when the snapshot is read
struct state_piece {
    ggml_tensor * tensor;  // nullptr: `size` bytes of the snapshot's metadata from `offset`
    size_t        offset;
    size_t        size;
};

// llama_io_write_host's writing, keeping the metadata and recording the tensor ranges instead of copying them
class snapshot_writer : public llama_io_write_i {
public:
    void write(const void * src, size_t size) override {
        const auto * bytes = static_cast<const uint8_t *>(src);
        pieces.push_back({nullptr, meta.size(), size});
        meta.insert(meta.end(), bytes, bytes + size);
        n_written += size;
    }

    void write_tensor(ggml_tensor * tensor, size_t offset, size_t size) override {
        pieces.push_back({tensor, offset, size});
        n_written += size;
    }

    size_t n_bytes() override {
        return n_written;
    }

    std::vector<state_piece> pieces;
    std::vector<uint8_t>     meta;
    size_t n_written = 0;
};

} // namespace

struct llama_state_snapshot {
    std::vector<state_piece> pieces;
    std::vector<uint8_t>     meta;
    size_t size = 0;
};

llama_state_snapshot * llama_state_seq_snapshot(llama_context * ctx, llama_seq_id seq_id) {
    llama_memory_t mem = ctx->get_memory();
    if (!mem || seq_id < 0) {
        return nullptr;
    }
    ctx->synchronize();

    snapshot_writer io;
    try {
        const uint32_t magic = STATE_SEQ_MAGIC;
        io.write(&magic, sizeof(magic));
        io.write(&seq_id, sizeof(seq_id));
        mem->state_write(io, seq_id, 0);
    } catch (const std::exception & err) {
        LLAMA_LOG_ERROR("%s: error taking a state snapshot: %s\n", __func__, err.what());
        return nullptr;
    }

    auto * snap = new llama_state_snapshot;
    snap->pieces = std::move(io.pieces);
    snap->meta   = std::move(io.meta);
    snap->size   = io.n_written;
    return snap;
}

size_t llama_state_snapshot_size(const llama_state_snapshot * snap) {
    return snap ? snap->size : 0;
}

size_t llama_state_snapshot_read(const llama_state_snapshot * snap, uint8_t * dst, size_t size) {
    if (!snap || size < snap->size) {
        return 0;
    }
    uint8_t * out = dst;
    for (const auto & p : snap->pieces) {
        if (p.tensor) {
            ggml_backend_tensor_get(p.tensor, out, p.offset, p.size);
        } else {
            memcpy(out, snap->meta.data() + p.offset, p.size);
        }
        out += p.size;
    }
    return snap->size;
}

void llama_state_snapshot_free(llama_state_snapshot * snap) {
    delete snap;
}

struct llama_state_staged {
    std::vector<tensor_write> writes;
    size_t n_bytes = 0;
    bool   written = false;
};

llama_state_staged * llama_state_seq_stage(llama_context * ctx, const uint8_t * src, size_t size, llama_seq_id seq_id,
                                           size_t * n_read) {
    if (n_read) {
        *n_read = 0;
    }
    llama_memory_t mem = ctx->get_memory();
    if (!mem || seq_id < 0) {
        return nullptr;
    }
    ctx->synchronize();

    staging_reader io(src, size);
    try {
        uint32_t magic = 0;
        io.read(&magic, sizeof(magic));
        if (magic != STATE_SEQ_MAGIC) {
            throw std::runtime_error("wrong sequence state magic");
        }
        llama_seq_id seq_id_read;
        io.read(&seq_id_read, sizeof(seq_id_read));
        // the KV cache frees the cells it took when a check fails (llama_kv_cache::state_read)
        mem->state_read(io, seq_id, 0);
    } catch (const std::exception & err) {
        LLAMA_LOG_ERROR("%s: error staging state: %s\n", __func__, err.what());
        return nullptr;
    }

    auto * staged = new llama_state_staged;
    staged->writes  = std::move(io.writes);
    staged->n_bytes = io.n_write;
    if (n_read) {
        *n_read = io.n_bytes();
    }
    return staged;
}

size_t llama_state_staged_n_bytes(const llama_state_staged * staged) {
    return staged ? staged->n_bytes : 0;
}

int32_t llama_state_staged_write(llama_state_staged * staged) {
    if (staged->written) {
        return -1;
    }
    for (const auto & w : staged->writes) {
        ggml_backend_tensor_set(w.tensor, w.src, w.offset, w.size);
    }
    staged->written = true;
    return 0;
}

void llama_state_staged_free(llama_state_staged * staged) {
    delete staged;
}
