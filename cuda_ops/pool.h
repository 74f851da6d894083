// GPU memory pools: suballocation of large device segments, stream-ordered, thread-safe. Plain C++: no torch and no
// CUDA headers. The device is reached through a Backend (cuda_ops/pool_cuda.cu for the GPU, HostBackend below for unit
// tests on machines without one), so the same policy code runs in both.
//
// Two policies share one interface:
//   BestFitPool     best-fit over free blocks with splitting and coalescing. Requests up to 1 MiB come from 2 MiB
//                   "small" segments, larger ones from "large" segments, so small blocks never pin large segments.
//                   When no free block fits, wholly free large segments go back to the device before a new one is
//                   made, so cached memory that cannot serve the request does not raise the peak.
//   PowerOfTwoPool  the baseline many simple GPU frameworks write: every request is rounded up to a power of two
//                   and served from a free list of that size, one device allocation per block, nothing is ever split
//                   or merged. It exists to show what that rounding costs in memory.
//
// Streams. A block belongs to the stream it was allocated on. Freed, it is reusable at once on that stream, since later
// work on the stream is ordered after earlier work. A request on another stream may take it too, but first makes its
// stream wait on an event recorded on the owner (on the device; the host never blocks). Free neighbours from different
// streams merge the same way, so freeing everything always coalesces back to whole segments. A block that was also used
// on other streams (record_stream) goes back to the free lists only after events recorded on each of those streams at
// free time have completed.
//
// CUDA graphs (PyTorch's CUDACachingAllocator semantics). A graph replays the addresses it captured, so what it
// allocates during capture must stay its own. Between begin_allocate_to_pool(id, filter) and end_allocate_to_pool(id),
// a request on a stream the filter accepts (a stream capturing into that graph) is served from the private pool `id`:
// segments and free lists of its own, never handed to the device pool's requests. A block freed during the capture is
// reused later in the same capture on the same stream (the graph orders the two); a block freed after it (the graph's
// memory, between replays) goes back to the private pool's free lists, and the pool's memory stays reserved until the
// pool is released. Each begin_allocate_to_pool or create_or_incref_pool adds a use, each release_pool drops one
// (graphs sharing a pool each hold one); with no use left and its last block freed, its segments go back to the
// device. Private pools never reuse memory across streams.
// While any capture is underway the pool makes no call a capture forbids or that would break it: no event queries,
// records or waits (cross-stream reuse, merges across streams and record_stream's events wait until it ends), no
// device synchronization and no release of memory (out of memory then fails at once). New segments are allowed: the
// CUDA backend makes them in relaxed capture mode, as PyTorch's caching allocator does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchext::memory {

// A cudaStream_t as an integer (0 is the legacy default stream). The host backend treats it as a plain id.
using StreamId = std::uintptr_t;
// A backend's event (cudaEvent_t for the GPU).
using EventId = void*;
// A private pool's id: PyTorch's c10::cuda::MempoolId_t. {0, 0} names the device pool itself.
using PoolId = std::pair<uint64_t, uint64_t>;
// True for the streams whose requests go to a private pool while allocations are routed to it.
using StreamFilter = std::function<bool(StreamId)>;

constexpr size_t kAlignment = 512;          // every block's size and address is a multiple of this
constexpr size_t kSmallRequest = 1 << 20;   // requests up to 1 MiB are "small"
constexpr size_t kSmallSegment = 2 << 20;   // small requests are packed into 2 MiB segments
constexpr size_t kLargeRounding = 2 << 20;  // larger requests get a segment of their size rounded to 2 MiB

// What a pool needs from the device. The pool calls it with its lock held, so a backend needs no lock of its own for
// the pool's sake; one with methods of its own that others may call at any time (HostBackend's complete_events,
// set_capacity, waits) locks its state itself.
class Backend {
 public:
  virtual ~Backend() = default;
  // Device memory of `bytes` bytes aligned to kAlignment, or nullptr when the device is out of memory (any other
  // failure throws std::runtime_error).
  virtual void* reserve(size_t bytes) = 0;
  virtual void release(void* ptr, size_t bytes) = 0;
  // An event marking everything queued on `stream` so far.
  virtual EventId record_event(StreamId stream) = 0;
  virtual bool event_done(EventId event) = 0;
  // Work queued on `waiter` from now on waits for `event` (on the device).
  virtual void wait_event(StreamId waiter, EventId event) = 0;
  virtual void destroy_event(EventId event) = 0;
  // Blocks the host until all work on the device has finished.
  virtual void synchronize() = 0;
  // The device's free and total memory in bytes, or {-1, -1} when unknown (for OOM messages).
  virtual std::pair<int64_t, int64_t> device_memory() { return {-1, -1}; }
  virtual std::string name() const = 0;
};

// Host memory standing in for a device, for tests: an optional capacity makes reserve() fail like an out-of-memory
// device, and events complete only when the test says so (complete_events), so stream ordering can be checked. Every
// method is thread-safe: a test thread may complete events or change the capacity while others allocate (the pool
// then holds its lock, and takes this backend's lock inside it; the backend never calls the pool).
class HostBackend final : public Backend {
 public:
  explicit HostBackend(size_t capacity = 0) : capacity_(capacity) {}
  ~HostBackend() override;
  void* reserve(size_t bytes) override;
  void release(void* ptr, size_t bytes) override;
  EventId record_event(StreamId stream) override;
  bool event_done(EventId event) override;
  void wait_event(StreamId waiter, EventId event) override;
  void destroy_event(EventId event) override;
  void synchronize() override;
  std::pair<int64_t, int64_t> device_memory() override;
  std::string name() const override { return "host"; }

  // Completes every event recorded so far (as if the device caught up).
  void complete_events();
  void set_capacity(size_t capacity);
  // While set, the simulated device is capturing a CUDA graph: event records, queries and waits, synchronize and
  // release throw std::logic_error naming the call (each would break a real capture); reserve still works.
  void set_capture_underway(bool underway);
  // Cross-stream waits issued so far (waiter, stream the event was recorded on), for tests. A copy: the list grows
  // while other threads allocate.
  std::vector<std::pair<StreamId, StreamId>> waits() const;

 private:
  struct Event {
    StreamId stream;
    bool done;
  };
  mutable std::mutex mutex_;  // guards everything below
  size_t capacity_;
  size_t in_use_ = 0;
  bool capture_underway_ = false;
  uintptr_t next_event_ = 0;
  std::unordered_map<EventId, Event> events_;
  std::vector<std::pair<StreamId, StreamId>> waits_;
};

struct PoolStats {
  // Current and peak sums: of the blocks handed out (multiples of 512), of the sizes the callers asked for, and of
  // the segments held from the device.
  int64_t allocated_bytes = 0, allocated_bytes_peak = 0;
  int64_t requested_bytes = 0, requested_bytes_peak = 0;
  int64_t reserved_bytes = 0, reserved_bytes_peak = 0;
  int64_t active_blocks = 0;        // blocks handed out and not yet freed
  int64_t allocations = 0;          // successful allocate() calls with a nonzero size, since the pool was made
  int64_t cache_hits = 0;           // of those, served from memory the pool already held
  int64_t segments = 0;             // segments held now
  int64_t device_allocs = 0;        // Backend::reserve calls (cudaMalloc), failed ones included
  int64_t device_frees = 0;         // Backend::release calls (cudaFree)
  int64_t cross_stream_reuses = 0;  // free memory taken over by another stream through an event wait (a
                                    // request served from it, or a merge with a neighbour freed on another stream)
  int64_t pending_free_bytes = 0;   // freed blocks waiting for the events of record_stream's streams
  int64_t largest_free_block = 0;   // largest block a request could get without asking the device
  int64_t free_bytes = 0;           // reserved - allocated - pending: held by the pool, not handed out
  int64_t oom_retries = 0;          // device allocations that failed and were retried after freeing the cache
  int64_t ooms = 0;                 // requests that failed after the retry
  int64_t graph_pools = 0;          // private pools (CUDA graphs) held now
  int64_t graph_pool_bytes = 0;     // of reserved_bytes, the bytes in their segments
  // All figures above cover the device pool and the private pools together, except largest_free_block, which is the
  // device pool's (a private pool's free memory serves only its graphs).
  // External fragmentation of the cached memory: 1 - largest_free_block / free_bytes (0 when nothing is free). 0 means
  // all free memory is one block; near 1, it is scattered in pieces too small for a large request.
  double fragmentation() const {
    return free_bytes > 0 ? 1.0 - static_cast<double>(largest_free_block) / static_cast<double>(free_bytes) : 0.0;
  }
};

// One block of a segment as seen from outside, for tests and snapshots.
struct BlockInfo {
  uintptr_t address;
  size_t size;
  StreamId stream;
  bool allocated;  // handed out, or freed but waiting on record_stream events
};
struct SegmentInfo {
  uintptr_t address;
  size_t size;
  bool small;
  std::vector<BlockInfo> blocks;  // in address order, covering the segment exactly
  PoolId pool{0, 0};              // the private pool it belongs to; {0, 0}: the device pool
};

// Every method is thread-safe: one mutex per pool guards all of its state, and the backend is called only under it.
class Pool {
 public:
  virtual ~Pool() = default;
  // `bytes` bytes ordered on `stream`, aligned to 512. nullptr for 0 bytes (not an error), and when the device is out
  // of memory even after the cached segments were given back: then last_error() says why.
  virtual void* allocate(size_t bytes, StreamId stream) = 0;
  // Throws std::invalid_argument for a pointer this pool did not hand out (or already took back). nullptr is a no-op.
  virtual void free(void* ptr) = 0;
  // The block at `ptr` is also used on `stream`: it will not be reused before the work queued there up to free() has
  // finished. Throws std::invalid_argument for an unknown pointer.
  virtual void record_stream(void* ptr, StreamId stream) = 0;
  virtual PoolStats stats() = 0;
  virtual void reset_peak_stats() = 0;
  // Returns every segment with no block in use to the device; returns the bytes released.
  virtual size_t empty_cache() = 0;
  virtual std::vector<SegmentInfo> snapshot() = 0;
  // The size of the block handed out at `ptr` (0 if unknown).
  virtual size_t block_size(const void* ptr) = 0;
  // Why the calling thread's last failed allocate() on this pool failed ("" if none did): another thread's failure
  // in between does not change it.
  virtual std::string last_error() = 0;
  virtual std::string kind() const = 0;

  // CUDA graphs (see the top of this file); the names are PyTorch's CUDAAllocator methods. Bad ids throw
  // std::invalid_argument.
  // Requests on the streams `filter` accepts go to private pool `id` (made if new; one use more) until
  // end_allocate_to_pool(id). Several ids may be routed at once; a request goes to the first whose filter takes it.
  virtual void begin_allocate_to_pool(PoolId id, StreamFilter filter) = 0;
  virtual void end_allocate_to_pool(PoolId id) = 0;
  // One use of the private pool less; with none left, its segments go back to the device once its last block is
  // freed (at once if none is live; deferred while a capture is underway).
  virtual void release_pool(PoolId id) = 0;
  virtual void create_or_incref_pool(PoolId id) = 0;
  // The private pool's uses (0 for an id that names none).
  virtual int pool_use_count(PoolId id) = 0;

  // The backend, for its name() and, on the host backend, its own thread-safe test methods. Its Backend methods
  // belong to the pool: called from outside, they would bypass the pool's lock and bookkeeping.
  virtual Backend& backend() = 0;
};

// The GPU backend (cuda_ops/pool_cuda.cu, only in builds with CUDA): cudaMalloc and cudaFree on `device`, events for
// stream order. It switches to `device` around each CUDA call and back, so it never touches another device.
std::unique_ptr<Backend> make_cuda_backend(int device);

std::unique_ptr<Pool> make_best_fit_pool(std::unique_ptr<Backend> backend);
std::unique_ptr<Pool> make_power_of_two_pool(std::unique_ptr<Backend> backend);
// kind: "best_fit" or "pow2"; throws std::invalid_argument otherwise.
std::unique_ptr<Pool> make_pool(const std::string& kind, std::unique_ptr<Backend> backend);

// A one-paragraph human summary of the stats, for out-of-memory messages.
std::string describe(const PoolStats& s);

}  // namespace torchext::memory
