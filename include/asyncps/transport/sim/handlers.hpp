// asyncps — type-erased, move-only callables of the simulated network: the actions its events
// run and the completion handlers of its pending operations (internal).
#pragma once

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

#include <asio/any_io_executor.hpp>
#include <asio/associated_executor.hpp>
#include <asio/post.hpp>

namespace asyncps::detail {

/// A move-only `void()` callable (events hold move-only handlers).
class sim_action {
 public:
  sim_action() noexcept = default;
  template <class F>
    requires(!std::same_as<std::remove_cvref_t<F>, sim_action>)
  explicit sim_action(F&& f)
      : p_(std::make_unique<impl<std::remove_cvref_t<F>>>(std::forward<F>(f))) {}
  void operator()() { p_->call(); }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 private:
  struct base {
    virtual ~base() = default;
    virtual void call() = 0;
  };
  template <class F>
  struct impl final : base {
    template <class G>
    explicit impl(G&& g) : fn(std::forward<G>(g)) {}
    void call() override { fn(); }
    F fn;
  };
  std::unique_ptr<base> p_;
};

/// A type-erased, move-only completion handler taking `Args...`. `post` submits it, with its
/// arguments, to the handler's associated executor (never runs it inline), as Asio's own
/// operations do.
template <class... Args>
class sim_completion {
 public:
  sim_completion() noexcept = default;
  template <class Handler>
  sim_completion(Handler&& h, const asio::any_io_executor& fallback)
      : p_(std::make_unique<impl<std::remove_cvref_t<Handler>>>(std::forward<Handler>(h),
                                                                fallback)) {}
  explicit operator bool() const noexcept { return p_ != nullptr; }
  /// Posts the handler with `args`; this object is empty afterwards. Precondition: not empty.
  void post(Args... args) {
    auto p = std::move(p_);
    p->post(std::move(args)...);
  }

 private:
  struct base {
    virtual ~base() = default;
    virtual void post(Args&&... args) = 0;
  };
  template <class H>
  struct impl final : base {
    template <class G>
    impl(G&& g, const asio::any_io_executor& fb) : h(std::forward<G>(g)), fallback(fb) {}
    void post(Args&&... args) override {
      auto ex = asio::get_associated_executor(h, fallback);
      asio::post(ex, [h = std::move(h), ... a = std::move(args)]() mutable {
        std::move(h)(std::move(a)...);
      });
    }
    H h;
    asio::any_io_executor fallback;
  };
  std::unique_ptr<base> p_;
};

}  // namespace asyncps::detail
