// The two pool policies of pool.h and the host backend. See pool.h for what they promise.
//
// Bookkeeping shared by both policies (PoolBase): the table of blocks handed out, statistics, record_stream and the
// blocks waiting on its events. The policies differ only in how they find a free block for a request, what they ask the
// device for when there is none, how a freed block rejoins the free lists, and what they give back.
#include "pool.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace torchext::memory {

namespace {

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// Sizes in messages: "1.50 GiB", "512 B".
std::string human_bytes(double n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = n;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(u == 0 ? 0 : 2);
  s << v << ' ' << units[u];
  return s.str();
}

// A number for the calling thread, unique in the process: unlike std::thread::id, never reused after a thread ends.
uint64_t this_thread_number() {
  static std::atomic<uint64_t> next{0};
  thread_local const uint64_t number = next.fetch_add(1);
  return number;
}

enum class State : uint8_t { kFree, kAllocated, kPending };

struct Segment;

struct Block {
  char* ptr = nullptr;
  size_t size = 0;       // multiple of kAlignment
  size_t requested = 0;  // what the caller asked for (while allocated)
  StreamId stream = 0;   // the stream whose order protects this block
  State state = State::kFree;
  int pending_events = 0;         // while kPending: events not yet complete
  std::vector<StreamId> used_on;  // other streams that used it (record_stream), while allocated
  Segment* segment = nullptr;
  Block* prev = nullptr;  // neighbours within the segment, in address order (best-fit pool only)
  Block* next = nullptr;
};

struct Segment {
  char* ptr = nullptr;
  size_t size = 0;
  bool small = false;
  Block* head = nullptr;  // the block at the segment's start: never merged away, so stable for the segment's life
};

// Free blocks ordered by (stream, size, address): the first block at or after (s, n, 0) is the best fit for n bytes
// among stream s's blocks.
struct BySize {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream != b->stream) return a->stream < b->stream;
    if (a->size != b->size) return a->size < b->size;
    return a->ptr < b->ptr;
  }
};
using FreeSet = std::set<Block*, BySize>;

class PoolBase : public Pool {
 public:
  explicit PoolBase(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {}
  ~PoolBase() override {
    // Whatever is still handed out belongs to callers that outlived the pool; give back only what is ours.
    for (auto& [event_block, event] : pending_) backend_->destroy_event(event);
    for (Block* b : block_cache_) delete b;
  }

  void* allocate(size_t bytes, StreamId stream) override {
    if (bytes == 0) return nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    if (bytes > std::numeric_limits<size_t>::max() / 2) {
      errors_[this_thread_number()] =
          "cannot allocate " + std::to_string(bytes) + " bytes: the request is larger than any device";
      ++stats_.ooms;
      return nullptr;
    }
    if (!pending_.empty()) process_pending();
    note_stream(stream);
    const size_t size = block_size_for(bytes);
    bool hit = true;
    Block* b = take_free(size, stream);
    if (b == nullptr) {
      hit = false;
      b = grow(size, stream);
    }
    if (b == nullptr) {
      // Out of memory: give the cached segments back to the device and retry once, first without waiting, then after
      // the device has finished everything queued (which completes every record_stream event).
      ++stats_.oom_retries;
      for (int attempt = 0; attempt < 2 && b == nullptr; ++attempt) {
        if (attempt == 1) backend_->synchronize();
        process_pending();
        b = take_free(size, stream);
        hit = b != nullptr;
        if (b == nullptr) {
          release_cached();
          b = grow(size, stream);
        }
      }
    }
    if (b == nullptr) {
      ++stats_.ooms;
      std::ostringstream msg;
      msg << "out of memory: tried to allocate " << human_bytes(static_cast<double>(bytes)) << " on "
          << backend_->name() << " (a block of " << human_bytes(static_cast<double>(size)) << ")";
      auto [dev_free, dev_total] = backend_->device_memory();
      if (dev_total >= 0) msg << "; the device has " << human_bytes(dev_free) << " free of " << human_bytes(dev_total);
      msg << ". Pool (" << kind() << "): " << describe(compute_stats());
      errors_[this_thread_number()] = msg.str();
      return nullptr;
    }
    b->state = State::kAllocated;
    b->requested = bytes;
    allocated_.emplace(b->ptr, b);
    ++stats_.allocations;
    stats_.cache_hits += hit ? 1 : 0;
    ++stats_.active_blocks;
    add(stats_.allocated_bytes, stats_.allocated_bytes_peak, static_cast<int64_t>(b->size));
    add(stats_.requested_bytes, stats_.requested_bytes_peak, static_cast<int64_t>(bytes));
    return b->ptr;
  }

  void free(void* ptr) override {
    if (ptr == nullptr) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(ptr);
    if (it == allocated_.end()) throw std::invalid_argument(unknown_pointer("free", ptr));
    Block* b = it->second;
    allocated_.erase(it);
    --stats_.active_blocks;
    stats_.allocated_bytes -= static_cast<int64_t>(b->size);
    stats_.requested_bytes -= static_cast<int64_t>(b->requested);
    b->requested = 0;
    if (b->used_on.empty()) {
      insert_free(b);
      return;
    }
    // Used on other streams: wait (on the host, lazily) for what was queued there up to now.
    b->state = State::kPending;
    b->pending_events = static_cast<int>(b->used_on.size());
    for (StreamId s : b->used_on) pending_.emplace_back(b, backend_->record_event(s));
    b->used_on.clear();
    stats_.pending_free_bytes += static_cast<int64_t>(b->size);
  }

  void record_stream(void* ptr, StreamId stream) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(ptr);
    if (it == allocated_.end()) throw std::invalid_argument(unknown_pointer("record_stream", ptr));
    Block* b = it->second;
    if (stream == b->stream) return;
    if (std::find(b->used_on.begin(), b->used_on.end(), stream) == b->used_on.end()) b->used_on.push_back(stream);
  }

  PoolStats stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pending_.empty()) process_pending();
    return compute_stats();
  }

  void reset_peak_stats() override {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.allocated_bytes_peak = stats_.allocated_bytes;
    stats_.requested_bytes_peak = stats_.requested_bytes;
    stats_.reserved_bytes_peak = stats_.reserved_bytes;
  }

  size_t empty_cache() override {
    std::lock_guard<std::mutex> lock(mutex_);
    process_pending();
    return release_cached();
  }

  size_t block_size(const void* ptr) override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = allocated_.find(const_cast<void*>(ptr));
    return it == allocated_.end() ? 0 : it->second->size;
  }

  std::string last_error() override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = errors_.find(this_thread_number());
    return it == errors_.end() ? std::string() : it->second;
  }

  std::vector<SegmentInfo> snapshot() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!pending_.empty()) process_pending();
    std::vector<SegmentInfo> out = segments_info();
    std::sort(out.begin(), out.end(), [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
    return out;
  }

  Backend& backend() override { return *backend_; }

 protected:
  // Policy hooks, all called with mutex_ held.
  virtual size_t block_size_for(size_t bytes) const = 0;
  // A free block of at least `size` bytes made usable on `stream`, already out of the free lists and split to size;
  // nullptr if there is none.
  virtual Block* take_free(size_t size, StreamId stream) = 0;
  // A block of `size` bytes carved from new device memory; nullptr if the device has none.
  virtual Block* grow(size_t size, StreamId stream) = 0;
  // A block that is no longer in use rejoins the free lists.
  virtual void insert_free(Block* b) = 0;
  // Gives every wholly free segment back to the device; returns the bytes released.
  virtual size_t release_cached() = 0;
  // Sum and largest of the free blocks.
  virtual std::pair<int64_t, int64_t> free_totals() const = 0;
  virtual std::vector<SegmentInfo> segments_info() const = 0;

  // For the policies' destructors: the blocks still handed out or waiting on events (their memory goes back to the
  // device with the pool; a caller still holding one has a dangling pointer, as with any destroyed allocator).
  std::vector<Block*> outstanding_blocks() const {
    std::vector<Block*> out;
    for (const auto& [ptr, b] : allocated_) out.push_back(b);
    for (const auto& [b, event] : pending_)
      if (std::find(out.begin(), out.end(), b) == out.end()) out.push_back(b);
    return out;
  }

  void* reserve(size_t bytes) {
    ++stats_.device_allocs;
    void* p = backend_->reserve(bytes);
    if (p != nullptr) {
      if (reinterpret_cast<uintptr_t>(p) % kAlignment != 0) {
        backend_->release(p, bytes);
        throw std::runtime_error(backend_->name() + " returned memory that is not 512-byte aligned");
      }
      add(stats_.reserved_bytes, stats_.reserved_bytes_peak, static_cast<int64_t>(bytes));
      ++stats_.segments;
    }
    return p;
  }

  void release(void* p, size_t bytes) {
    backend_->release(p, bytes);
    ++stats_.device_frees;
    stats_.reserved_bytes -= static_cast<int64_t>(bytes);
    --stats_.segments;
  }

  Block* new_block() {
    if (block_cache_.empty()) return new Block();
    Block* b = block_cache_.back();
    block_cache_.pop_back();
    return b;
  }
  void delete_block(Block* b) {
    *b = Block();
    block_cache_.push_back(b);
  }

  const std::vector<StreamId>& streams() const { return streams_; }
  PoolStats& counters() { return stats_; }

 private:
  static void add(int64_t& current, int64_t& peak, int64_t n) {
    current += n;
    peak = std::max(peak, current);
  }

  void note_stream(StreamId s) {
    if (std::find(streams_.begin(), streams_.end(), s) == streams_.end()) streams_.push_back(s);
  }

  // Blocks whose record_stream events have all completed rejoin the free lists.
  void process_pending() {
    size_t kept = 0;
    for (auto& entry : pending_) {
      auto [b, event] = entry;
      if (backend_->event_done(event)) {
        backend_->destroy_event(event);
        if (--b->pending_events == 0) {
          stats_.pending_free_bytes -= static_cast<int64_t>(b->size);
          insert_free(b);
        }
      } else {
        pending_[kept++] = entry;
      }
    }
    pending_.resize(kept);
  }

  PoolStats compute_stats() const {
    PoolStats s = stats_;
    std::tie(s.free_bytes, s.largest_free_block) = free_totals();
    return s;
  }

  std::string unknown_pointer(const char* what, const void* ptr) const {
    std::ostringstream msg;
    msg << what << ": pointer " << ptr << " was not allocated by this " << kind() << " pool, or was already freed";
    return msg.str();
  }

  std::unique_ptr<Backend> backend_;
  std::mutex mutex_;
  PoolStats stats_;
  std::unordered_map<void*, Block*> allocated_;
  std::vector<std::pair<Block*, EventId>> pending_;
  std::vector<StreamId> streams_;  // every stream seen, for the cross-stream search
  std::vector<Block*> block_cache_;
  // Each thread's last allocation failure (by this_thread_number), so that a thread reads its own even when others
  // fail too. One entry per thread that ever failed on this pool.
  std::unordered_map<uint64_t, std::string> errors_;
};

// ---------------------------------------------------------------------------------------------------------------
class BestFitPool final : public PoolBase {
 public:
  using PoolBase::PoolBase;
  // Gives all device memory back, including blocks still handed out (see outstanding_blocks).
  ~BestFitPool() override {
    for (Segment* seg : segments_) {
      for (Block* b = seg->head; b != nullptr;) {
        Block* next = b->next;
        delete b;
        b = next;
      }
      release(seg->ptr, seg->size);
      delete seg;
    }
  }
  std::string kind() const override { return "best_fit"; }

 protected:
  std::vector<SegmentInfo> segments_info() const override {
    std::vector<SegmentInfo> out;
    for (const Segment* seg : segments_) {
      SegmentInfo info{reinterpret_cast<uintptr_t>(seg->ptr), seg->size, seg->small, {}};
      for (const Block* b = seg->head; b != nullptr; b = b->next)
        info.blocks.push_back({reinterpret_cast<uintptr_t>(b->ptr), b->size, b->stream, b->state != State::kFree});
      out.push_back(std::move(info));
    }
    return out;
  }

  size_t block_size_for(size_t bytes) const override { return round_up(bytes, kAlignment); }

  static bool is_small(size_t size) { return size <= kSmallRequest; }

  Block* take_free(size_t size, StreamId stream) override {
    FreeSet& set = free_[is_small(size)];
    Block key;
    key.size = size;
    // Best fit among the stream's own blocks: reusable at once, no synchronisation.
    key.stream = stream;
    auto it = set.lower_bound(&key);
    Block* best = (it != set.end() && (*it)->stream == stream) ? *it : nullptr;
    if (best == nullptr) {
      // Best fit among the other streams' blocks; taking one costs an event wait on the device.
      for (StreamId s : streams()) {
        if (s == stream) continue;
        key.stream = s;
        auto jt = set.lower_bound(&key);
        if (jt != set.end() && (*jt)->stream == s && (best == nullptr || (*jt)->size < best->size)) best = *jt;
      }
      if (best == nullptr) return nullptr;
      set.erase(best);
      EventId e = backend().record_event(best->stream);
      backend().wait_event(stream, e);
      backend().destroy_event(e);
      best->stream = stream;
      ++counters().cross_stream_reuses;
    } else {
      set.erase(it);
    }
    split(best, size);
    return best;
  }

  // A new segment: 2 MiB for small requests, else the request rounded up to 2 MiB. First, every wholly free large
  // segment goes back to the device: none could serve this request, and keeping them would only raise the peak of
  // reserved memory (on the recorded ResNet-18 steps this brings peak reserved / peak requested from 1.30 to 1.05).
  // Misses are rare once a training loop has run a few steps, so the cudaFree calls cost nothing in steady state.
  Block* grow(size_t size, StreamId stream) override {
    const bool small = is_small(size);
    release_whole_free(free_[0]);
    const size_t seg_size = small ? kSmallSegment : round_up(size, kLargeRounding);
    void* p = reserve(seg_size);
    if (p == nullptr) return nullptr;
    auto* seg = new Segment{static_cast<char*>(p), seg_size, small, nullptr};
    segments_.insert(seg);
    Block* b = new_block();
    b->ptr = seg->ptr;
    b->size = seg_size;
    b->stream = stream;
    b->segment = seg;
    seg->head = b;
    split(b, size);
    return b;
  }

  void insert_free(Block* b) override {
    b->state = State::kFree;
    FreeSet& set = free_[b->segment->small];
    for (Block* n : {b->prev, b->next}) {
      if (n == nullptr || n->state != State::kFree) continue;
      set.erase(n);
      if (n->stream != b->stream) {
        // A free neighbour last used on another stream: the merged block is b's stream's once that stream waits for the
        // other's work so far (usually long finished, so the wait costs the device nothing).
        EventId e = backend().record_event(n->stream);
        backend().wait_event(b->stream, e);
        backend().destroy_event(e);
        ++counters().cross_stream_reuses;
      }
      Block* first = n == b->prev ? n : b;
      Block* second = n == b->prev ? b : n;
      first->stream = b->stream;
      first->size += second->size;
      first->next = second->next;
      if (second->next != nullptr) second->next->prev = first;
      delete_block(second);
      b = first;
    }
    set.insert(b);
  }

  // Gives the wholly free segments of one free set back to the device; returns the bytes released.
  size_t release_whole_free(FreeSet& set) {
    size_t released = 0;
    for (auto it = set.begin(); it != set.end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr) {
        ++it;
        continue;
      }
      it = set.erase(it);
      Segment* seg = b->segment;
      release(seg->ptr, seg->size);
      released += seg->size;
      segments_.erase(seg);
      delete seg;
      delete_block(b);
    }
    return released;
  }

  size_t release_cached() override { return release_whole_free(free_[0]) + release_whole_free(free_[1]); }

  std::pair<int64_t, int64_t> free_totals() const override {
    int64_t total = 0, largest = 0;
    for (const FreeSet& set : free_)
      for (const Block* b : set) {
        total += static_cast<int64_t>(b->size);
        largest = std::max(largest, static_cast<int64_t>(b->size));
      }
    return {total, largest};
  }

 private:
  // Cuts `b` down to `size` bytes when the rest is worth keeping as a free block of its own: any remainder in a small
  // segment, and in a large segment a remainder bigger than a small request (smaller slivers there could only ever
  // serve small requests, which never come to large segments, so they stay with the block).
  void split(Block* b, size_t size) {
    b->state = State::kAllocated;  // so that the remainder does not merge straight back into it
    const size_t rest = b->size - size;
    const bool keep = b->segment->small ? rest >= kAlignment : rest > kSmallRequest;
    if (!keep) return;
    Block* r = new_block();
    r->ptr = b->ptr + size;
    r->size = rest;
    r->stream = b->stream;
    r->segment = b->segment;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r;
    b->next = r;
    b->size = size;
    insert_free(r);
  }

  FreeSet free_[2];  // [large, small]
  std::set<Segment*> segments_;
};

// ---------------------------------------------------------------------------------------------------------------
class PowerOfTwoPool final : public PoolBase {
 public:
  using PoolBase::PoolBase;
  ~PowerOfTwoPool() override {
    release_cached();
    for (Block* b : outstanding_blocks()) {
      release(b->ptr, b->size);
      delete b;
    }
  }
  std::string kind() const override { return "pow2"; }

 protected:
  // Every block is a segment of its own.
  std::vector<SegmentInfo> segments_info() const override {
    std::vector<SegmentInfo> out;
    auto add = [&](const Block* b, bool in_use) {
      out.push_back({reinterpret_cast<uintptr_t>(b->ptr),
                     b->size,
                     false,
                     {{reinterpret_cast<uintptr_t>(b->ptr), b->size, b->stream, in_use}}});
    };
    for (const auto& [key, blocks] : free_)
      for (const Block* b : blocks) add(b, false);
    for (const Block* b : outstanding_blocks()) add(b, true);
    return out;
  }

  size_t block_size_for(size_t bytes) const override {
    size_t n = kAlignment;
    while (n < bytes) n <<= 1;
    return n;
  }

  Block* take_free(size_t size, StreamId stream) override {
    auto it = free_.find({stream, size});
    if (it == free_.end() || it->second.empty()) return nullptr;
    Block* b = it->second.back();
    it->second.pop_back();
    return b;
  }

  Block* grow(size_t size, StreamId stream) override {
    void* p = reserve(size);
    if (p == nullptr) return nullptr;
    Block* b = new_block();
    b->ptr = static_cast<char*>(p);
    b->size = size;
    b->stream = stream;
    return b;
  }

  void insert_free(Block* b) override {
    b->state = State::kFree;
    free_[{b->stream, b->size}].push_back(b);
  }

  size_t release_cached() override {
    size_t released = 0;
    for (auto& [key, blocks] : free_) {
      for (Block* b : blocks) {
        release(b->ptr, b->size);
        released += b->size;
        delete_block(b);
      }
      blocks.clear();
    }
    return released;
  }

  std::pair<int64_t, int64_t> free_totals() const override {
    int64_t total = 0, largest = 0;
    for (const auto& [key, blocks] : free_) {
      total += static_cast<int64_t>(key.second * blocks.size());
      if (!blocks.empty()) largest = std::max(largest, static_cast<int64_t>(key.second));
    }
    return {total, largest};
  }

 private:
  std::map<std::pair<StreamId, size_t>, std::vector<Block*>> free_;  // (stream, size) -> free blocks
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
std::unique_ptr<Pool> make_best_fit_pool(std::unique_ptr<Backend> backend) {
  return std::make_unique<BestFitPool>(std::move(backend));
}
std::unique_ptr<Pool> make_power_of_two_pool(std::unique_ptr<Backend> backend) {
  return std::make_unique<PowerOfTwoPool>(std::move(backend));
}
std::unique_ptr<Pool> make_pool(const std::string& kind, std::unique_ptr<Backend> backend) {
  if (kind == "best_fit") return make_best_fit_pool(std::move(backend));
  if (kind == "pow2") return make_power_of_two_pool(std::move(backend));
  throw std::invalid_argument("pool kind must be 'best_fit' or 'pow2', got '" + kind + "'");
}

std::string describe(const PoolStats& s) {
  std::ostringstream out;
  out << "allocated " << human_bytes(s.allocated_bytes) << " (peak " << human_bytes(s.allocated_bytes_peak) << ") in "
      << s.active_blocks << " blocks, reserved " << human_bytes(s.reserved_bytes) << " (peak "
      << human_bytes(s.reserved_bytes_peak) << ") in " << s.segments << " segments, free in the pool "
      << human_bytes(s.free_bytes) << " (largest block " << human_bytes(s.largest_free_block) << ", fragmentation ";
  out.setf(std::ios::fixed);
  out.precision(2);
  out << s.fragmentation() << "), waiting on other streams " << human_bytes(s.pending_free_bytes) << "; "
      << s.allocations << " allocations, " << s.cache_hits << " cache hits, " << s.device_allocs
      << " device allocations, " << s.ooms << " out-of-memory failures";
  return out.str();
}

// ---------------------------------------------------------------------------------------------------------------
HostBackend::~HostBackend() = default;

void* HostBackend::reserve(size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capacity_ != 0 && in_use_ + bytes > capacity_) return nullptr;
  void* p = std::aligned_alloc(kAlignment, round_up(bytes, kAlignment));
  if (p == nullptr) return nullptr;
  in_use_ += bytes;
  return p;
}

void HostBackend::release(void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::free(ptr);
  in_use_ -= bytes;
}

EventId HostBackend::record_event(StreamId stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto id = reinterpret_cast<EventId>(++next_event_);
  events_[id] = {stream, false};
  return id;
}

bool HostBackend::event_done(EventId event) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) throw std::logic_error("host backend: unknown event");
  return it->second.done;
}

void HostBackend::wait_event(StreamId waiter, EventId event) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = events_.find(event);
  if (it == events_.end()) throw std::logic_error("host backend: unknown event");
  waits_.emplace_back(waiter, it->second.stream);
}

void HostBackend::destroy_event(EventId event) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (events_.erase(event) != 1) throw std::logic_error("host backend: event destroyed twice");
}

void HostBackend::complete_events() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [id, e] : events_) e.done = true;
}

void HostBackend::set_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mutex_);
  capacity_ = capacity;
}

std::vector<std::pair<StreamId, StreamId>> HostBackend::waits() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waits_;
}

std::pair<int64_t, int64_t> HostBackend::device_memory() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capacity_ == 0) return {-1, -1};
  return {static_cast<int64_t>(capacity_ > in_use_ ? capacity_ - in_use_ : 0), static_cast<int64_t>(capacity_)};
}

}  // namespace torchext::memory
