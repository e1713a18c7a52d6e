// Vocabulary types that carry their unit: simulated Time (integer picoseconds, exact and
// totally ordered), Bytes, Flops, FlopRate and Bandwidth. Mixing them up does not
// compile; the only ways across are the named constructors and the operators below
// (Bytes / Bandwidth -> Time, Flops / FlopRate -> Time, ...).
#pragma once

#include <cmath>
#include <compare>
#include <cstdint>
#include <limits>

namespace hetpar {

/// A point or span of simulated time in integer picoseconds. int64 covers +-106 days,
/// far beyond any training iteration; integer time makes event order exact.
class Time {
 public:
  constexpr Time() = default;
  static constexpr Time ps(int64_t v) { return Time(v); }
  static constexpr Time ns(double v) { return from_scaled(v, 1e3); }
  static constexpr Time us(double v) { return from_scaled(v, 1e6); }
  static constexpr Time ms(double v) { return from_scaled(v, 1e9); }
  static constexpr Time seconds(double v) { return from_scaled(v, 1e12); }
  static constexpr Time zero() { return Time(0); }
  static constexpr Time max() { return Time(std::numeric_limits<int64_t>::max()); }

  constexpr int64_t count_ps() const { return ps_; }
  constexpr double to_seconds() const { return static_cast<double>(ps_) * 1e-12; }
  constexpr double to_ms() const { return static_cast<double>(ps_) * 1e-9; }
  constexpr double to_us() const { return static_cast<double>(ps_) * 1e-6; }

  constexpr auto operator<=>(const Time&) const = default;
  constexpr Time operator+(Time o) const { return Time(ps_ + o.ps_); }
  constexpr Time operator-(Time o) const { return Time(ps_ - o.ps_); }
  constexpr Time& operator+=(Time o) {
    ps_ += o.ps_;
    return *this;
  }
  constexpr Time& operator-=(Time o) {
    ps_ -= o.ps_;
    return *this;
  }
  constexpr Time operator*(int64_t k) const { return Time(ps_ * k); }
  /// Ratio of two spans (e.g. bubble fraction).
  constexpr double operator/(Time o) const {
    return static_cast<double>(ps_) / static_cast<double>(o.ps_);
  }

 private:
  constexpr explicit Time(int64_t v) : ps_(v) {}
  // Rounds to the nearest picosecond; durations are never negative-rounded to zero-crossing.
  // Spans past int64's range saturate (the conversion would be undefined); callers that
  // simulate refuse such spans first (planner::kMaxIterationAtPeak).
  static constexpr Time from_scaled(double v, double scale) {
    double p = v * scale;
    if (p >= 0x1p63) return max();  // 2^63: past int64
    if (p <= -0x1p63) return Time(std::numeric_limits<int64_t>::min());
    return Time(static_cast<int64_t>(p < 0 ? p - 0.5 : p + 0.5));
  }
  int64_t ps_ = 0;
};

/// A byte count (memory sizes, message sizes). Signed so differences are safe.
class Bytes {
 public:
  constexpr Bytes() = default;
  constexpr explicit Bytes(int64_t v) : v_(v) {}
  static constexpr Bytes KiB(double v) { return Bytes(static_cast<int64_t>(v * 1024.0)); }
  static constexpr Bytes MiB(double v) { return Bytes(static_cast<int64_t>(v * 1048576.0)); }
  static constexpr Bytes GiB(double v) { return Bytes(static_cast<int64_t>(v * 1073741824.0)); }
  static constexpr Bytes GB(double v) { return Bytes(static_cast<int64_t>(v * 1e9)); }
  constexpr int64_t count() const { return v_; }
  constexpr double as_double() const { return static_cast<double>(v_); }
  constexpr double to_GiB() const { return static_cast<double>(v_) / 1073741824.0; }

  constexpr auto operator<=>(const Bytes&) const = default;
  constexpr Bytes operator+(Bytes o) const { return Bytes(v_ + o.v_); }
  constexpr Bytes operator-(Bytes o) const { return Bytes(v_ - o.v_); }
  constexpr Bytes& operator+=(Bytes o) {
    v_ += o.v_;
    return *this;
  }
  constexpr Bytes& operator-=(Bytes o) {
    v_ -= o.v_;
    return *this;
  }
  constexpr Bytes operator*(int64_t k) const { return Bytes(v_ * k); }
  constexpr Bytes operator/(int64_t k) const { return Bytes(v_ / k); }
  constexpr double operator/(Bytes o) const { return as_double() / o.as_double(); }

 private:
  int64_t v_ = 0;
};

/// A count of floating-point operations (one multiply-add = 2 FLOPs). Double: totals for
/// a whole training run exceed int64.
class Flops {
 public:
  constexpr Flops() = default;
  constexpr explicit Flops(double v) : v_(v) {}
  constexpr double count() const { return v_; }
  constexpr auto operator<=>(const Flops&) const = default;
  constexpr Flops operator+(Flops o) const { return Flops(v_ + o.v_); }
  constexpr Flops operator-(Flops o) const { return Flops(v_ - o.v_); }
  constexpr Flops& operator+=(Flops o) {
    v_ += o.v_;
    return *this;
  }
  constexpr Flops operator*(double k) const { return Flops(v_ * k); }
  constexpr Flops operator/(double k) const { return Flops(v_ / k); }
  constexpr double operator/(Flops o) const { return v_ / o.v_; }

 private:
  double v_ = 0;
};

/// Compute throughput in FLOP/s.
class FlopRate {
 public:
  constexpr FlopRate() = default;
  static constexpr FlopRate per_second(double v) { return FlopRate(v); }
  static constexpr FlopRate tflops(double v) { return FlopRate(v * 1e12); }
  constexpr double per_second() const { return v_; }
  constexpr double to_tflops() const { return v_ * 1e-12; }
  constexpr auto operator<=>(const FlopRate&) const = default;
  constexpr FlopRate operator*(double k) const { return FlopRate(v_ * k); }
  constexpr double operator/(FlopRate o) const { return v_ / o.v_; }

 private:
  constexpr explicit FlopRate(double v) : v_(v) {}
  double v_ = 0;
};

/// Data rate in bytes per second, one direction. Datasheet link speeds quoted in
/// bits per second go through gbit_per_s().
class Bandwidth {
 public:
  constexpr Bandwidth() = default;
  static constexpr Bandwidth bytes_per_s(double v) { return Bandwidth(v); }
  static constexpr Bandwidth GBps(double v) { return Bandwidth(v * 1e9); }
  static constexpr Bandwidth gbit_per_s(double v) { return Bandwidth(v * 1e9 / 8.0); }
  constexpr double bytes_per_s() const { return v_; }
  constexpr double to_GBps() const { return v_ * 1e-9; }
  constexpr auto operator<=>(const Bandwidth&) const = default;
  constexpr Bandwidth operator*(double k) const { return Bandwidth(v_ * k); }
  constexpr Bandwidth operator+(Bandwidth o) const { return Bandwidth(v_ + o.v_); }
  constexpr double operator/(Bandwidth o) const { return v_ / o.v_; }

 private:
  constexpr explicit Bandwidth(double v) : v_(v) {}
  double v_ = 0;
};

/// Time to move `b` at rate `bw`. REQUIRES: bw > 0.
constexpr Time operator/(Bytes b, Bandwidth bw) {
  return Time::seconds(b.as_double() / bw.bytes_per_s());
}
/// Time to execute `f` at rate `r`. REQUIRES: r > 0.
constexpr Time operator/(Flops f, FlopRate r) {
  return Time::seconds(f.count() / r.per_second());
}
/// Achieved rate of `f` done in `t`.
constexpr FlopRate operator/(Flops f, Time t) {
  return FlopRate::per_second(f.count() / t.to_seconds());
}
/// Achieved rate of `b` moved in `t`.
constexpr Bandwidth operator/(Bytes b, Time t) {
  return Bandwidth::bytes_per_s(b.as_double() / t.to_seconds());
}

}  // namespace hetpar
