// Native simulated device: the Verilated Aggregator top with a C++ memory model and an
// AXI4-Lite master, behind a small C ABI (loaded from Python with ctypes; see
// gnnweave/sim/simdevice.py).
//
// Timing model. The test bench parts are registered processes, exactly as the cocotb
// bench (sim/tb.py: cocotbext-axi AxiRam + DelayedReadAddress, no pause generators)
// behaves: at every rising edge each process samples the pre-edge handshake signals and
// drives new values that the DUT sees from the next edge on.
//   * AR/AW/W sinks: a queue of 2; READY for the next cycle = queue not full after the
//     edge's transfer. A pump moves AR bursts from the sink queue into the latency line
//     while fewer than `max_outstanding` bursts wait there.
//   * A burst taken at edge k is due at edge k + latency (the bench's Timer); the read
//     process then queues its beats (queue of 2) for the R source, which drives one beat
//     per edge. `r_lead` says whether a burst due at edge t is seen by the R source at
//     edge t itself (1: the bench's Timer fires before the clock edge of the same time
//     step) or at t + 1 (0). With latency 0 the bench has no Timer: the beats follow the
//     edge after the AR transfer.
//   * The write process takes AW, then its W beats (honouring WSTRB), then queues B
//     (queue of 2) for the B source.
// One eval() per cycle. Verilator re-runs its input-combinational ('ico') region on every
// eval() and detects the rising edge by comparing ap_clk with its value at the previous
// eval(). No output port of the top depends combinationally on an input (outputs come
// from registers), so the falling-edge eval() that only settled the new inputs changes
// nothing the bench samples: the harness leaves the clock high, marks it low in the
// model's edge detector and evaluates once per cycle, where the inputs settle and the
// edge fires. `gw_set_check_one_eval` runs the falling-edge eval() as well and counts
// every cycle where it changed a sampled output (must stay 0; the tests check it), and
// a Verilator whose model lacks the edge detector member falls back to two evals.
// A board-like memory (gw_set_memory_model; off by default, when the timing above holds
// exactly): every read burst gets a random extra latency (uniform in 0..jitter), DRAM
// costs (an 8-bank open-row model: a burst occupies the shared DRAM for one slot per
// 64-byte chunk it touches, plus a row-miss penalty when its bank has another row open;
// bursts are scheduled first come first served), and with `reorder` bursts of different
// IDs are answered in the order they become ready (each ID's own in order). Write
// responses get the same random latency. Chosen bursts can be answered SLVERR/DECERR
// (gw_inject_error: reads return their beats with that RRESP, writes are dropped and
// answered with that BRESP), and every burst is checked against the buffers the host
// configured (gw_set_regions), counting those that reach outside them.
// Memory is a byte buffer owned by the caller (numpy) at physical address `base`; every
// beat outside [base, base + size) is refused (read: zeros + SLVERR, write: dropped +
// SLVERR) and recorded, as are bursts that are not INCR, not full width, unaligned or
// crossing a 4 KiB boundary.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>
#include <string>
#include <type_traits>
#include <utility>

#include "verilated.h"
#include "Vgnnweave_sim_top.h"
#include "Vgnnweave_sim_top___024root.h"

// The unit clocks (see gnnweave/sim/device/top.py): each unit of the top runs on a clock
// of its own, which the harness gives an edge only while the unit is busy, for a drain
// margin after that, and for a wake margin after every register write and reset. The
// generated header names the build's units through this detector of the model's
// per-clock edge memory (absent in a Verilator that does not keep one). The control
// slave's bus side has a clock of its own as well (bit kControlClock of the masks): it
// gets an edge during every register access and reset, and for a drain margin after.
#define GW_UNIT_EDGE_DETECTOR(U, MEMBER)                                                    \
    template <typename R, typename = void>                                                  \
    struct HasUnitPrev##U : std::false_type {};                                             \
    template <typename R>                                                                   \
    struct HasUnitPrev##U<R, std::void_t<decltype(std::declval<R&>().MEMBER)>>              \
        : std::true_type {};                                                                \
    template <typename R>                                                                   \
    inline void gw_unit_edge_##U(R* r, uint32_t on) {                                       \
        if constexpr (HasUnitPrev##U<R>::value) {                                           \
            if (on) r->MEMBER = 0;                                                          \
        } else {                                                                            \
            (void)r; (void)on;                                                              \
        }                                                                                   \
    }
#include "gw_units.h"

#define GW_EXPORT __attribute__((visibility("default")))

#ifndef BUS_BYTES
#error "BUS_BYTES must be defined (AXI data width in bytes)"
#endif

double sc_time_stamp() { return 0; }

namespace {

constexpr uint32_t kBusBytes = BUS_BYTES;
constexpr uint64_t kBoundary = 4096;
constexpr int kQueueLimit = 2;  // cocotbext-axi queue_occupancy_limit of every channel

using Root = Vgnnweave_sim_top___024root;
// Whether the Verilated model keeps ap_clk's previous value where the harness can reach it.
template <typename R, typename = void>
struct HasClockPrev : std::false_type {};
template <typename R>
struct HasClockPrev<R, std::void_t<decltype(std::declval<R&>().__Vtrigprevexpr___TOP__ap_clk__0)>>
    : std::true_type {};
constexpr bool kOneEvalPossible = HasClockPrev<Root>::value && gw_unit_edges_possible<Root>();
// Unit clocks: edges a unit keeps getting after it was last busy (its pipelines drain and
// its done pulse ends) and after a register write or reset (configuration settles into
// any register that copies it). Generous: both are short against a job's cycles.
constexpr uint64_t kUnitDrainCycles = 64;
// A part of a unit with a clock of its own (kPartMask) is busy while any of its stages
// holds an element, so it needs no edge beyond its busy ones.
constexpr uint64_t kPartDrainCycles = 1;
constexpr uint64_t kUnitWakeCycles = 64;
// Edges the control's bus clock keeps getting after a register read (the register slice
// and the read response have drained long before).
constexpr uint64_t kControlDrainCycles = 8;
constexpr int kMaxUnits = 32;
}  // namespace

// The model's own evaluation (ico, act, nba regions). Vgnnweave_sim_top::eval() wraps it
// in eval_step(), which also takes the context's deleter mutex and flushes the thread
// message queue on every call (for class objects and --threads $display: neither exists
// here), about 100 instructions a cycle. Declared weak: a Verilator without this function
// leaves it null and the harness calls eval() (gw_create's first eval() always does the
// model's initialisation).
void Vgnnweave_sim_top___024root___eval(Vgnnweave_sim_top___024root* vlSelf) __attribute__((weak));

namespace {

// The outputs the bench samples at an edge (for the one-eval check).
struct Sampled {
    uint64_t araddr, awaddr, wstrb;
    uint32_t arlen, arid, arsize, arburst, awlen, awid, awsize, awburst;
    uint8_t wdata[kBusBytes];
    bool arvalid, awvalid, wvalid, wlast, rready, bready;
    uint32_t ctl_rdata;
    bool ctl_awready, ctl_wready, ctl_bvalid, ctl_arready, ctl_rvalid, irq;
    bool operator==(const Sampled& o) const { return std::memcmp(this, &o, sizeof o) == 0; }
};

template <typename T>
inline void wide_to_bytes(const T& v, uint8_t* out) {
    if constexpr (std::is_integral_v<T>) {
        std::memcpy(out, &v, kBusBytes);
    } else {
        std::memcpy(out, v.data(), kBusBytes);
    }
}

template <typename T>
inline void bytes_to_wide(T& v, const uint8_t* in) {
    if constexpr (std::is_integral_v<T>) {
        T x = 0;
        std::memcpy(&x, in, kBusBytes);
        v = x;
    } else {
        std::memcpy(v.data(), in, kBusBytes);
    }
}

// A FIFO on a power-of-two ring that grows when full (std::deque allocated and walked
// its node map on the per-cycle path; the bench queues hold 2 entries, the latency
// line up to max_outstanding).
template <typename T>
class Fifo {
  public:
    Fifo() : buf_(new T[4]), mask_(3) {}
    bool empty() const { return count_ == 0; }
    size_t size() const { return count_; }
    T& front() { return buf_[head_]; }
    const T& front() const { return buf_[head_]; }
    void pop_front() { head_ = (head_ + 1) & mask_; --count_; }
    void push_back(const T& v) {
        if (count_ > mask_) grow();
        buf_[(head_ + count_) & mask_] = v;
        ++count_;
    }
    void clear() { head_ = count_ = 0; }

  private:
    void grow() {
        std::unique_ptr<T[]> bigger(new T[2 * (mask_ + 1)]);
        for (size_t i = 0; i < count_; ++i) bigger[i] = buf_[(head_ + i) & mask_];
        buf_ = std::move(bigger);
        mask_ = 2 * mask_ + 1;
        head_ = 0;
    }
    std::unique_ptr<T[]> buf_;
    size_t mask_, head_ = 0, count_ = 0;
};

struct Burst {
    uint64_t addr;
    uint32_t beats;
    uint32_t id;
    uint64_t due;     // edge from which the read process may answer it
    uint32_t resp;    // injected response (0: OKAY)
    uint64_t seq;     // arrival order
};

// DRAM geometry of the memory model: 64-byte access granularity, 8 banks interleaved at
// 2 KiB, a row of 16 KiB across the banks.
constexpr uint32_t kChunkBytes = 64;
constexpr uint32_t kBanks = 8;
constexpr uint32_t kBankShift = 11;
constexpr uint32_t kRowShift = 14;

struct Injection { bool write; uint64_t ordinal; uint32_t resp; };
struct Region { uint64_t start, end; };

struct RBeat {
    uint8_t data[kBusBytes];
    uint32_t id;
    bool last;
    uint32_t resp;
};

struct Sim {
    std::unique_ptr<VerilatedContext> ctx;
    std::unique_ptr<Vgnnweave_sim_top> top;
    uint8_t* mem = nullptr;
    uint64_t size = 0, base = 0;
    uint32_t latency = 0, max_outstanding = 64;
    int r_lead = 1;
    bool stall_reads = false;
    uint64_t cycle = 0;
    bool one_eval = kOneEvalPossible;
    bool check_one_eval = false;
    uint64_t one_eval_mismatches = 0;

    // unit clocks (see the top of the file)
    bool gate_units = true;
    uint64_t wake_until = 0;                  // every unit clocked before this edge
    uint64_t unit_awake_until[kMaxUnits] = {};
    uint64_t control_awake_until = 0;         // the control's bus clock runs before this edge
    uint64_t unit_edges[kMaxUnits] = {};      // edges each clock got (control: its bit)

    // The clocks (units, control) with an edge at the coming edge (the units' busy
    // outputs settled before it).
    inline uint32_t unit_clock_mask() {
        const uint32_t busy = gw_unit_busy(top.get());
        uint32_t mask = cycle < control_awake_until ? kControlClock : 0;
        for (uint32_t m = kUnitMask; m; m &= m - 1) {
            const int u = __builtin_ctz(m);
            if (busy >> u & 1)
                unit_awake_until[u] = cycle + (kPartMask >> u & 1 ? kPartDrainCycles
                                                                 : kUnitDrainCycles);
            if (cycle < unit_awake_until[u]) mask |= 1u << u;
        }
        if (!gate_units || cycle < wake_until) mask = kUnitMask | kControlClock;
        for (uint32_t m = mask; m; m &= m - 1) ++unit_edges[__builtin_ctz(m)];
        return mask;
    }
    void wake_units() { wake_until = ~0ull; }
    void settle_units() { wake_until = cycle + kUnitWakeCycles; }
    void wake_control() { control_awake_until = ~0ull; }
    void settle_control() { control_awake_until = cycle + kControlDrainCycles; }

    // read side
    bool ar_ready = false;
    int ar_sink = 0;                 // bursts in the AR sink queue (not yet pumped)
    Fifo<Burst> ar_sink_q;
    Fifo<Burst> line;                // pumped, waiting for their latency / the read process
    uint32_t in_flight = 0;          // bursts in `line` (the bench's _in_flight)
    Burst cur_r{};
    uint32_t cur_r_left = 0, cur_r_beat = 0;
    Fifo<RBeat> r_q;
    bool r_valid = false;

    // write side
    bool aw_ready = false, w_ready = false;
    Fifo<Burst> aw_q;
    struct WBeat { uint8_t data[kBusBytes]; uint64_t strb; bool last; };
    Fifo<WBeat> w_q;
    bool w_active = false;
    Burst cur_w{};
    uint32_t cur_w_beat = 0;
    uint32_t cur_w_resp = 0;
    bool b_waiting = false;          // a B response waits for room in the B queue
    uint32_t b_waiting_id = 0, b_waiting_resp = 0;
    struct BResp { uint32_t id, resp; };
    Fifo<BResp> b_q;
    bool b_valid = false;

    // statistics and faults
    uint64_t ar_bursts = 0, aw_bursts = 0, r_beats = 0, w_beats = 0;
    uint64_t faults = 0, protocol_errors = 0;
    std::string first_fault;

    // board-like memory model (see the top of the file)
    bool model = false, reorder = false, dram = false;
    uint32_t jitter = 0, row_miss = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    uint64_t dram_free = 0;
    uint64_t open_row[kBanks];
    uint64_t bank_free[kBanks];
    std::vector<Burst> waiting;      // model: pumped read bursts, in arrival order
    struct PendingB { uint32_t id, resp; uint64_t due; };
    Fifo<PendingB> b_pending;        // model: write responses waiting for their latency
    uint64_t seq = 0;
    std::vector<Injection> injections;
    std::vector<Region> regions[2];  // 0 read, 1 write; empty: not checked
    uint64_t region_violations = 0, injected = 0, reordered = 0, row_misses = 0;

    uint64_t next_random() {
        rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
        return rng;
    }

    uint32_t take_injection(bool write, uint64_t ordinal) {
        for (size_t i = 0; i < injections.size(); ++i) {
            if (injections[i].write == write && injections[i].ordinal == ordinal) {
                const uint32_t resp = injections[i].resp;
                injections.erase(injections.begin() + long(i));
                ++injected;
                return resp;
            }
        }
        return 0;
    }

    void check_region(bool write, uint64_t addr, uint32_t beats) {
        const auto& list = regions[write ? 1 : 0];
        if (list.empty()) return;
        const uint64_t end = addr + uint64_t(beats) * kBusBytes;
        for (const Region& r : list)
            if (addr >= r.start && end <= r.end) return;
        ++region_violations;
        if (first_fault.empty()) {
            char buf[200];
            std::snprintf(buf, sizeof buf, "%s burst [0x%llx, 0x%llx) outside the configured %s buffers at cycle %llu",
                          write ? "write" : "read", (unsigned long long)addr, (unsigned long long)end,
                          write ? "write" : "read", (unsigned long long)cycle);
            first_fault = buf;
        }
    }

    // Edge from which the model answers a read burst accepted into the line at edge e:
    // the bench latency, then (dram) its bank (busy until its last transfer, plus a
    // row-miss penalty when another row is open) and the shared data bus (one slot per
    // 64-byte chunk touched), then the interconnect's random extra latency.
    uint64_t model_due(const Burst& b, uint64_t e) {
        uint64_t t = e + latency;
        if (dram) {
            const uint64_t first = b.addr / kChunkBytes;
            const uint64_t last = (b.addr + uint64_t(b.beats) * kBusBytes - 1) / kChunkBytes;
            const uint32_t bank = uint32_t(b.addr >> kBankShift) % kBanks;
            const uint64_t row = b.addr >> kRowShift;
            if (bank_free[bank] > t) t = bank_free[bank];
            if (open_row[bank] != row) {
                t += row_miss;
                open_row[bank] = row;
                ++row_misses;
            }
            if (dram_free > t) t = dram_free;
            const uint32_t slot = kChunkBytes / kBusBytes ? kChunkBytes / kBusBytes : 1;
            dram_free = bank_free[bank] = t + (last - first + 1) * slot;
        }
        return t + (jitter ? next_random() % (uint64_t(jitter) + 1) : 0);
    }

    // The next read burst the model answers at edge e (index into `waiting`), or -1.
    long pick_waiting(uint64_t e) const {
        long best = -1;
        uint64_t seen_ids = 0;   // IDs with an older burst still waiting (ids < 64)
        for (size_t i = 0; i < waiting.size(); ++i) {
            const Burst& b = waiting[i];
            const uint64_t bit = 1ull << (b.id & 63);
            const bool head_of_id = !(seen_ids & bit);
            seen_ids |= bit;
            if (!reorder) return b.due <= e ? long(i) : -1;
            if (head_of_id && b.due <= e && (best < 0 || b.due < waiting[size_t(best)].due))
                best = long(i);
        }
        return best;
    }

    void note_fault(const char* what, uint64_t addr, uint64_t nbytes) {
        ++faults;
        if (first_fault.empty()) {
            char buf[200];
            std::snprintf(buf, sizeof buf, "%s at 0x%llx (%llu bytes) outside memory [0x%llx, 0x%llx) at cycle %llu",
                          what, (unsigned long long)addr, (unsigned long long)nbytes,
                          (unsigned long long)base, (unsigned long long)(base + size),
                          (unsigned long long)cycle);
            first_fault = buf;
        }
    }

    void note_protocol(const char* what, uint64_t addr, uint32_t beats, uint32_t sz, uint32_t burst) {
        ++protocol_errors;
        if (first_fault.empty()) {
            char buf[200];
            std::snprintf(buf, sizeof buf, "%s burst at 0x%llx, %u beats, size %u, type %u at cycle %llu",
                          what, (unsigned long long)addr, beats, sz, burst, (unsigned long long)cycle);
            first_fault = buf;
        }
    }

    bool in_memory(uint64_t addr, uint64_t n) const {
        return addr >= base && addr - base <= size && n <= size - (addr - base);
    }

    void check_burst(const char* kind, uint64_t addr, uint32_t beats, uint32_t sz, uint32_t burst) {
        uint64_t nbytes = uint64_t(beats) * kBusBytes;
        if (burst != 1 || (1u << sz) != kBusBytes || addr % kBusBytes ||
            (addr % kBoundary) + nbytes > kBoundary)
            note_protocol(kind, addr, beats, sz, burst);
    }

    // One evaluation of the model from the per-cycle path (see the weak declaration above).
    inline void eval_model() {
        if (&Vgnnweave_sim_top___024root___eval) Vgnnweave_sim_top___024root___eval(top->rootp);
        else top->eval();
    }

    void apply_inputs() {
        auto* t = top.get();
        t->m_axi_gmem_arready = ar_ready;
        t->m_axi_gmem_awready = aw_ready;
        t->m_axi_gmem_wready = w_ready;
        t->m_axi_gmem_rvalid = r_valid;
        t->m_axi_gmem_bvalid = b_valid;
    }

    // One clock cycle: sample pre-edge values, rising edge, run the bench processes,
    // drive their outputs, settle the DUT's combinational logic.
    inline void tick() {
        auto* t = top.get();
        const bool ar_fire = ar_ready && t->m_axi_gmem_arvalid;
        Burst ar{};
        if (ar_fire) {
            ar.addr = t->m_axi_gmem_araddr;
            ar.beats = uint32_t(t->m_axi_gmem_arlen) + 1;
            ar.id = t->m_axi_gmem_arid;
            check_burst("read", ar.addr, ar.beats, t->m_axi_gmem_arsize, t->m_axi_gmem_arburst);
        }
        const bool aw_fire = aw_ready && t->m_axi_gmem_awvalid;
        Burst aw{};
        if (aw_fire) {
            aw.addr = t->m_axi_gmem_awaddr;
            aw.beats = uint32_t(t->m_axi_gmem_awlen) + 1;
            aw.id = t->m_axi_gmem_awid;
            check_burst("write", aw.addr, aw.beats, t->m_axi_gmem_awsize, t->m_axi_gmem_awburst);
        }
        const bool w_fire = w_ready && t->m_axi_gmem_wvalid;
        WBeat wb;
        if (w_fire) {
            wide_to_bytes(t->m_axi_gmem_wdata, wb.data);
            wb.strb = t->m_axi_gmem_wstrb;
            wb.last = t->m_axi_gmem_wlast;
        }
        const bool r_fire = r_valid && t->m_axi_gmem_rready;
        const bool b_fire = b_valid && t->m_axi_gmem_bready;

        rising_edge(unit_clock_mask());
        const uint64_t e = ++cycle;

        // --- sinks (ready for the next cycle: queue not full after this edge's transfer)
        if (ar_fire) {
            ar.resp = take_injection(false, ar_bursts);
            ar.seq = seq++;
            check_region(false, ar.addr, ar.beats);
            ar_sink_q.push_back(ar);
            ++ar_bursts;
        }
        ar_ready = int(ar_sink_q.size()) < kQueueLimit;
        if (aw_fire) {
            aw.resp = take_injection(true, aw_bursts);
            check_region(true, aw.addr, aw.beats);
            aw_q.push_back(aw);
            ++aw_bursts;
        }
        aw_ready = int(aw_q.size()) < kQueueLimit;
        if (w_fire) { w_q.push_back(wb); ++w_beats; }
        w_ready = int(w_q.size()) < kQueueLimit;

        // --- R source (timer-first bursts were queued before this edge's step)
        if (r_fire || !r_valid) {
            if (!r_q.empty()) {
                const RBeat& b = r_q.front();
                bytes_to_wide(t->m_axi_gmem_rdata, b.data);
                t->m_axi_gmem_rid = b.id;
                t->m_axi_gmem_rlast = b.last;
                t->m_axi_gmem_rresp = b.resp;
                r_q.pop_front();
                r_valid = true;
                ++r_beats;
            } else {
                r_valid = false;
            }
        }
        // --- B source
        if (b_fire || !b_valid) {
            if (!b_q.empty()) {
                t->m_axi_gmem_bid = b_q.front().id;
                t->m_axi_gmem_bresp = b_q.front().resp;
                b_q.pop_front();
                b_valid = true;
            } else {
                b_valid = false;
            }
        }

        // --- processes woken in this time step (after the edge callbacks)
        // pump: sink queue -> latency line
        while (!ar_sink_q.empty() && in_flight < max_outstanding) {
            Burst b = ar_sink_q.front();
            ar_sink_q.pop_front();
            if (model) {
                b.due = model_due(b, e);
                waiting.push_back(b);
            } else {
                b.due = latency == 0 ? e : e + latency - uint64_t(r_lead);
                line.push_back(b);
            }
            ++in_flight;
        }
        fill_r(e);
        run_write(e);

        apply_inputs();
        if (!one_eval) {
            t->ap_clk = 0;
            gw_unit_clocks(t, 0);
            eval_model();
        } else if (check_one_eval) {
            const Sampled before = sample();
            t->ap_clk = 0;
            eval_model();
            if (!(sample() == before)) ++one_eval_mismatches;
        }
    }

    // A clock held high between edges gets its edge from the edge detector marked low
    // (one-eval mode); one that the falling-edge eval took low rises (two-eval mode). A
    // unit clock outside `units` goes (or stays) low: no edge.
    inline void rising_edge(uint32_t units) {
        auto* t = top.get();
        if constexpr (kOneEvalPossible) {
            // the inputs set after the last edge settle in this eval's 'ico' phase
            if (one_eval) {
                t->rootp->__Vtrigprevexpr___TOP__ap_clk__0 = 0;
                gw_unit_edges(t->rootp, units);
            }
        }
        gw_unit_clocks(t, units);
        t->ap_clk = 1;
        eval_model();
    }

    Sampled sample() const {
        auto* t = top.get();
        Sampled x;
        std::memset(&x, 0, sizeof x);   // padding too: compared with memcmp
        x.araddr = t->m_axi_gmem_araddr; x.awaddr = t->m_axi_gmem_awaddr;
        x.wstrb = t->m_axi_gmem_wstrb;
        x.arlen = t->m_axi_gmem_arlen; x.arid = t->m_axi_gmem_arid;
        x.arsize = t->m_axi_gmem_arsize; x.arburst = t->m_axi_gmem_arburst;
        x.awlen = t->m_axi_gmem_awlen; x.awid = t->m_axi_gmem_awid;
        x.awsize = t->m_axi_gmem_awsize; x.awburst = t->m_axi_gmem_awburst;
        wide_to_bytes(t->m_axi_gmem_wdata, x.wdata);
        x.arvalid = t->m_axi_gmem_arvalid; x.awvalid = t->m_axi_gmem_awvalid;
        x.wvalid = t->m_axi_gmem_wvalid; x.wlast = t->m_axi_gmem_wlast;
        x.rready = t->m_axi_gmem_rready; x.bready = t->m_axi_gmem_bready;
        x.ctl_rdata = t->s_axi_control_rdata;
        x.ctl_awready = t->s_axi_control_awready; x.ctl_wready = t->s_axi_control_wready;
        x.ctl_bvalid = t->s_axi_control_bvalid; x.ctl_arready = t->s_axi_control_arready;
        x.ctl_rvalid = t->s_axi_control_rvalid; x.irq = t->__SYM__interrupt;
        return x;
    }

    // Read process: answer due bursts in order into the R queue (limit 2). Bursts due at
    // e + 1 whose Timer fires before that edge are queued here already (r_lead).
    inline void fill_r(uint64_t e) {
        while (int(r_q.size()) < kQueueLimit) {
            if (cur_r_left == 0) {
                if (stall_reads) return;
                if (model) {
                    const long i = pick_waiting(e);
                    if (i < 0) return;
                    cur_r = waiting[size_t(i)];
                    if (i > 0 && waiting[0].seq < cur_r.seq) ++reordered;
                    waiting.erase(waiting.begin() + i);
                } else {
                    if (line.empty() || line.front().due > e) return;
                    cur_r = line.front();
                    line.pop_front();
                }
                --in_flight;
                cur_r_left = cur_r.beats;
                cur_r_beat = 0;
            }
            RBeat b;
            const uint64_t a = cur_r.addr + uint64_t(cur_r_beat) * kBusBytes;
            if (in_memory(a, kBusBytes)) {
                std::memcpy(b.data, mem + (a - base), kBusBytes);
                b.resp = cur_r.resp;
            } else {
                std::memset(b.data, 0, kBusBytes);
                b.resp = 2;  // SLVERR
                note_fault("read", a, kBusBytes);
            }
            b.id = cur_r.id;
            ++cur_r_beat;
            --cur_r_left;
            b.last = cur_r_left == 0;
            r_q.push_back(b);
        }
    }

    inline void run_write(uint64_t e) {
        while (!b_pending.empty() && b_pending.front().due <= e && int(b_q.size()) < kQueueLimit) {
            b_q.push_back({b_pending.front().id, b_pending.front().resp});
            b_pending.pop_front();
        }
        for (;;) {
            if (b_waiting) {
                if (int(b_q.size()) >= kQueueLimit) return;
                b_q.push_back({b_waiting_id, b_waiting_resp});
                b_waiting = false;
            }
            if (!w_active) {
                if (aw_q.empty()) return;
                cur_w = aw_q.front();
                aw_q.pop_front();
                w_active = true;
                cur_w_beat = 0;
                cur_w_resp = cur_w.resp;
            }
            if (w_q.empty()) return;
            const WBeat& wb = w_q.front();
            const uint64_t a = cur_w.addr + uint64_t(cur_w_beat) * kBusBytes;
            if (cur_w.resp) {
                // an injected error: the write is dropped
            } else if (in_memory(a, kBusBytes)) {
                uint8_t* dst = mem + (a - base);
                for (uint32_t i = 0; i < kBusBytes; ++i)
                    if (wb.strb >> i & 1) dst[i] = wb.data[i];
            } else if (wb.strb) {
                note_fault("write", a, kBusBytes);
                cur_w_resp = 2;
            }
            const bool last = wb.last;
            w_q.pop_front();
            ++cur_w_beat;
            if (last != (cur_w_beat == cur_w.beats)) {
                note_protocol("write (WLAST)", cur_w.addr, cur_w.beats, 0, 1);
            }
            if (cur_w_beat == cur_w.beats) {
                w_active = false;
                if (model) {
                    const uint64_t d = e + latency / 2 + (jitter ? next_random() % (uint64_t(jitter) + 1) : 0);
                    b_pending.push_back({cur_w.id, cur_w_resp, d});
                } else {
                    b_waiting = true;
                    b_waiting_id = cur_w.id;
                    b_waiting_resp = cur_w_resp;
                }
            }
        }
    }

    void clear_bench() {
        ar_sink_q.clear(); line.clear(); in_flight = 0; cur_r_left = 0; r_q.clear();
        aw_q.clear(); w_q.clear(); w_active = false; b_waiting = false; b_q.clear();
        waiting.clear(); b_pending.clear(); dram_free = 0;
        for (auto& r : open_row) r = ~0ull;
        for (auto& f : bank_free) f = 0;
        r_valid = b_valid = ar_ready = aw_ready = w_ready = false;
        ctl_aw = ctl_w = ctl_b = ctl_ar = ctl_r = false;
    }

    // AXI4-Lite master (registered, like the memory side)
    bool ctl_aw = false, ctl_w = false, ctl_b = false, ctl_ar = false, ctl_r = false;

    void apply_ctl() {
        auto* t = top.get();
        t->s_axi_control_awvalid = ctl_aw;
        t->s_axi_control_wvalid = ctl_w;
        t->s_axi_control_bready = ctl_b;
        t->s_axi_control_arvalid = ctl_ar;
        t->s_axi_control_rready = ctl_r;
        t->eval();
    }

    bool reg_write(uint32_t addr, uint32_t value, uint32_t strb, uint64_t timeout) {
        wake_units();
        const bool ok = reg_write_clocked(addr, value, strb, timeout);
        settle_units();
        return ok;
    }

    bool reg_write_clocked(uint32_t addr, uint32_t value, uint32_t strb, uint64_t timeout) {
        auto* t = top.get();
        t->s_axi_control_awaddr = addr;
        t->s_axi_control_wdata = value;
        t->s_axi_control_wstrb = strb;
        ctl_aw = ctl_w = true;
        ctl_b = true;
        apply_ctl();
        for (uint64_t i = 0; i < timeout; ++i) {
            const bool awf = ctl_aw && t->s_axi_control_awready;
            const bool wf = ctl_w && t->s_axi_control_wready;
            const bool bf = ctl_b && t->s_axi_control_bvalid && !ctl_aw && !ctl_w;
            tick();
            if (awf) ctl_aw = false;
            if (wf) ctl_w = false;
            if (bf) { ctl_b = false; apply_ctl(); return true; }
            apply_ctl();
        }
        ctl_aw = ctl_w = ctl_b = false;
        apply_ctl();
        return false;
    }

    bool reg_read(uint32_t addr, uint32_t* value, uint64_t timeout) {
        wake_control();
        const bool ok = reg_read_clocked(addr, value, timeout);
        settle_control();
        return ok;
    }

    bool reg_read_clocked(uint32_t addr, uint32_t* value, uint64_t timeout) {
        auto* t = top.get();
        t->s_axi_control_araddr = addr;
        apply_ctl();
        tick();   // the wrapper registers ARADDR: present it a cycle before ARVALID
        ctl_ar = true;
        ctl_r = true;
        apply_ctl();
        for (uint64_t i = 0; i < timeout; ++i) {
            const bool arf = ctl_ar && t->s_axi_control_arready;
            const bool rf = ctl_r && t->s_axi_control_rvalid && !ctl_ar;
            const uint32_t data = t->s_axi_control_rdata;
            tick();
            if (arf) ctl_ar = false;
            if (rf) { *value = data; ctl_r = false; apply_ctl(); return true; }
            apply_ctl();
        }
        ctl_ar = ctl_r = false;
        apply_ctl();
        return false;
    }

    void reset(uint32_t cycles) {
        auto* t = top.get();
        wake_units();
        clear_bench();
        t->ap_rst_n = 0;
        apply_inputs();
        apply_ctl();
        for (uint32_t i = 0; i < cycles; ++i) tick();
        clear_bench();
        t->ap_rst_n = 1;
        apply_inputs();
        apply_ctl();
        tick();   // the wrapper's reset flop
        tick();
        settle_units();
    }
};

}  // namespace

extern "C" {

// Every entry point is exported; the rest of the library is hidden (-fvisibility=hidden).

GW_EXPORT void* gw_create(uint8_t* mem, uint64_t size, uint64_t base, uint32_t latency,
                uint32_t max_outstanding, int r_lead) {
    auto* s = new Sim();
    s->ctx = std::make_unique<VerilatedContext>();
    s->ctx->debug(0);
    s->top = std::make_unique<Vgnnweave_sim_top>(s->ctx.get(), "top");
    s->mem = mem;
    s->size = size;
    s->base = base;
    s->latency = latency;
    s->max_outstanding = max_outstanding ? max_outstanding : 1;
    s->r_lead = r_lead ? 1 : 0;
    s->top->ap_clk = 0;
    s->top->eval();
    s->reset(8);
    return s;
}

GW_EXPORT void gw_destroy(void* h) {
    auto* s = static_cast<Sim*>(h);
    if (!s) return;
    s->top->final();
    delete s;
}

GW_EXPORT void gw_set_memory(void* h, uint8_t* mem, uint64_t size, uint64_t base) {
    auto* s = static_cast<Sim*>(h);
    s->mem = mem; s->size = size; s->base = base;
}

GW_EXPORT void gw_set_latency(void* h, uint32_t latency, uint32_t max_outstanding) {
    auto* s = static_cast<Sim*>(h);
    s->latency = latency;
    s->max_outstanding = max_outstanding ? max_outstanding : 1;
}

GW_EXPORT void gw_set_read_stall(void* h, int stall) { static_cast<Sim*>(h)->stall_reads = stall != 0; }

GW_EXPORT void gw_reset(void* h, uint32_t cycles) { static_cast<Sim*>(h)->reset(cycles); }

// Returns 0 on success, -1 when the slave did not answer within `timeout` cycles.
GW_EXPORT int gw_reg_read(void* h, uint32_t addr, uint32_t* value, uint64_t timeout) {
    return static_cast<Sim*>(h)->reg_read(addr, value, timeout) ? 0 : -1;
}

GW_EXPORT int gw_reg_write(void* h, uint32_t addr, uint32_t value, uint32_t strb, uint64_t timeout) {
    return static_cast<Sim*>(h)->reg_write(addr, value, strb, timeout) ? 0 : -1;
}

GW_EXPORT uint64_t gw_step(void* h, uint64_t n) {
    auto* s = static_cast<Sim*>(h);
    for (uint64_t i = 0; i < n; ++i) s->tick();
    return n;
}

// Runs until the `interrupt` output is high (checked before each cycle) or `max_cycles`
// have passed; returns the cycles run.
GW_EXPORT uint64_t gw_run_until_interrupt(void* h, uint64_t max_cycles) {
    auto* s = static_cast<Sim*>(h);
    uint64_t i = 0;
    while (i < max_cycles && !s->top->__SYM__interrupt) { s->tick(); ++i; }
    return i;
}

GW_EXPORT int gw_interrupt(void* h) { return static_cast<Sim*>(h)->top->__SYM__interrupt ? 1 : 0; }

GW_EXPORT uint64_t gw_cycles(void* h) { return static_cast<Sim*>(h)->cycle; }

// stats: cycles, ar_bursts, aw_bursts, r_beats, w_beats, faults, protocol_errors,
// bursts in flight (AR line + current), B responses pending
GW_EXPORT int gw_stats(void* h, uint64_t* out, int n) {
    auto* s = static_cast<Sim*>(h);
    const uint64_t v[] = {s->cycle, s->ar_bursts, s->aw_bursts, s->r_beats, s->w_beats,
                          s->faults, s->protocol_errors,
                          uint64_t(s->line.size() + s->waiting.size() + s->ar_sink_q.size() +
                                   (s->cur_r_left ? 1 : 0)),
                          uint64_t(s->b_q.size() + s->b_pending.size() + (s->b_waiting ? 1 : 0)),
                          s->region_violations, s->injected, s->reordered, s->row_misses};
    const int k = int(sizeof v / sizeof v[0]);
    for (int i = 0; i < n && i < k; ++i) out[i] = v[i];
    return k;
}

GW_EXPORT int gw_first_fault(void* h, char* buf, int len) {
    auto* s = static_cast<Sim*>(h);
    if (len <= 0) return 0;
    std::snprintf(buf, size_t(len), "%s", s->first_fault.c_str());
    return int(s->first_fault.size());
}

GW_EXPORT void gw_clear_faults(void* h) {
    auto* s = static_cast<Sim*>(h);
    s->faults = s->protocol_errors = s->region_violations = 0;
    s->first_fault.clear();
}

GW_EXPORT uint32_t gw_bus_bytes() { return kBusBytes; }

// The board-like memory model (see the top of the file); on = 0 restores the exact bench
// timing. `jitter`: extra read latency drawn uniformly from 0..jitter per burst (and per
// write response); `dram`: the open-row model with `row_miss` cycles per row miss.
GW_EXPORT void gw_set_memory_model(void* h, int on, int reorder, uint32_t jitter, int dram,
                                   uint32_t row_miss, uint64_t seed) {
    auto* s = static_cast<Sim*>(h);
    s->model = on != 0;
    s->reorder = reorder != 0;
    s->jitter = jitter;
    s->dram = dram != 0;
    s->row_miss = row_miss;
    s->rng = seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (!s->rng) s->rng = 1;
    s->dram_free = 0;
    for (auto& r : s->open_row) r = ~0ull;
    for (auto& f : s->bank_free) f = 0;
}

// Answer the `after`-th read (write = 0) or write (1) burst from now (0: the next one)
// with `resp` (2 SLVERR, 3 DECERR).
GW_EXPORT void gw_inject_error(void* h, int write, uint64_t after, uint32_t resp) {
    auto* s = static_cast<Sim*>(h);
    s->injections.push_back({write != 0, (write ? s->aw_bursts : s->ar_bursts) + after, resp & 3});
}

GW_EXPORT void gw_clear_injections(void* h) { static_cast<Sim*>(h)->injections.clear(); }

// The buffers read (write = 0) or write (1) bursts may touch: n [start, end) pairs; n = 0
// stops checking that kind. A burst reaching outside every one of them is counted.
GW_EXPORT void gw_set_regions(void* h, int write, const uint64_t* pairs, int n) {
    auto* s = static_cast<Sim*>(h);
    auto& list = s->regions[write ? 1 : 0];
    list.clear();
    for (int i = 0; i < n; ++i) list.push_back({pairs[2 * i], pairs[2 * i + 1]});
}

// 1: one eval() per cycle (the default where the model allows it), 0: two.
GW_EXPORT int gw_set_one_eval(void* h, int on) {
    auto* s = static_cast<Sim*>(h);
    s->one_eval = kOneEvalPossible && on != 0;
    s->top->ap_clk = 0;   // the two-eval mode starts each cycle from a low clock
    s->top->eval();
    return s->one_eval ? 1 : 0;
}

// Also run the falling-edge eval() and count cycles where it changed a sampled output.
GW_EXPORT void gw_set_check_one_eval(void* h, int on) {
    static_cast<Sim*>(h)->check_one_eval = on != 0;
}

GW_EXPORT uint64_t gw_one_eval_mismatches(void* h) {
    return static_cast<Sim*>(h)->one_eval_mismatches;
}

// 1: unit clocks stop while their units are idle (the default); 0: every unit clock runs
// every cycle. Returns the mask of the build's units.
GW_EXPORT uint32_t gw_set_unit_gating(void* h, int on) {
    static_cast<Sim*>(h)->gate_units = on != 0;
    return kUnitMask;
}

GW_EXPORT uint32_t gw_unit_mask() { return kUnitMask; }

// Edges each unit's clock got since the device was made: out[u] for u < n.
GW_EXPORT int gw_unit_edge_counts(void* h, uint64_t* out, int n) {
    auto* s = static_cast<Sim*>(h);
    for (int u = 0; u < n && u < kMaxUnits; ++u) out[u] = s->unit_edges[u];
    return kMaxUnits;
}

}  // extern "C"
