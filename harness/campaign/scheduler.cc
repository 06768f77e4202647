#include "harness/campaign/scheduler.h"

#include <string>

namespace mlafuzz::campaign {
namespace {

Scheduler::Clock::time_point after(double seconds) {
  return Scheduler::Clock::now() + std::chrono::duration_cast<Scheduler::Clock::duration>(
                                       std::chrono::duration<double>(seconds));
}

}  // namespace

bool Scheduler::run(int jobs, const std::function<void(int)>& work, const Ticks& ticks) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    threads_running_ = jobs;
  }
  work_ = work;
  for (int t = 0; t < jobs; ++t) {
    threads_.emplace_back([this, t] {
      work_(t);
      std::lock_guard<std::mutex> lock(mu_);
      --threads_running_;
      cv_.notify_all();
    });
  }
  auto next_progress = after(ticks.progress_interval_s);
  auto next_report = after(opts_.report_interval_s);
  while (!threads_done()) {
    const int sig = opts_.signals ? opts_.signals->load() : 0;
    if (sig > 0 && !stop_seen_) notice_signal(sig);
    if (opts_.time_s && !time_up_ && elapsed() >= *opts_.time_s) {
      // No new case; cases in flight finish, shrinks stop at their current step.
      time_up_ = true;
      stop_ = true;
    }
    if (must_abandon(sig)) return false;
    const auto now = Clock::now();
    if (now >= next_progress) {
      ticks.progress();
      next_progress = after(ticks.progress_interval_s);
    }
    if (now >= next_report) {
      ticks.report();
      next_report = after(opts_.report_interval_s);
    }
  }
  return true;
}

bool Scheduler::threads_done() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return threads_running_ == 0; });
  return threads_running_ == 0;
}

void Scheduler::notice_signal(int) {
  stop_seen_ = Clock::now();
  stop_ = true;
  console_.message(
      "mlafuzz: stopping (signal): finishing the cases in flight, then writing the report "
      "(signal again to stop at once)\n");
}

bool Scheduler::must_abandon(int sig) {
  // In-flight cases finish within the case timeout; a second signal stops at once.
  if (stop_seen_) {
    return sig > 1 ||
           Clock::now() - *stop_seen_ > std::chrono::duration<double>(opts_.case_timeout_s + 5);
  }
  if (opts_.time_s && opts_.overrun_grace_s >= 0 &&
      elapsed() > *opts_.time_s + opts_.overrun_grace_s) {
    int running;
    {
      std::lock_guard<std::mutex> lock(mu_);
      running = threads_running_;
    }
    console_.message("mlafuzz: time budget spent; leaving " + std::to_string(running) +
                     " case(s) in flight unfinished (the failures seen are kept)\n");
    stop_ = true;
    return true;
  }
  return false;
}

std::string Scheduler::stop_cause() const {
  if (opts_.signals && opts_.signals->load() > 0) return "a signal stopped the campaign";
  if (time_up_) return "the time budget ended";
  if (stop_) return "the campaign stopped";
  return "";
}

void Scheduler::join() {
  for (auto& th : threads_) th.join();
  threads_.clear();
}

}  // namespace mlafuzz::campaign
