// The campaign's clock: runs the evaluation threads and, while they run, calls the progress and
// report ticks at their intervals, answers SIGINT/SIGTERM (finish the cases in flight; a second
// signal stops at once), stops when the time budget is spent (the cases in flight finish, shrinks
// stop at their current step) and gives up on cases still in flight when the time budget's
// overrun grace is spent.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "harness/campaign/campaign.h"
#include "harness/campaign/progress.h"

namespace mlafuzz::campaign {

class Scheduler {
 public:
  using Clock = std::chrono::steady_clock;

  Scheduler(const CampaignOptions& opts, Console& console) : opts_(opts), console_(console) {}

  void start_clock() { t0_ = Clock::now(); }
  double elapsed() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }
  // Whether evaluation threads should take no new case.
  bool stopping() const { return stop_.load() || (opts_.signals && opts_.signals->load() > 0); }
  void stop() { stop_ = true; }
  bool signalled() const { return stop_seen_.has_value(); }
  // Why the campaign is stopping ("the time budget ended"); empty while it runs.
  std::string stop_cause() const;

  struct Ticks {
    double progress_interval_s = 10;
    std::function<void()> progress, report;
  };
  // Runs work(0..jobs-1) on `jobs` threads until they return. Returns false when cases were
  // left in flight (a second signal, or the overrun grace spent): the threads still run, and the
  // caller must leave the process without joining them.
  bool run(int jobs, const std::function<void(int)>& work, const Ticks& ticks);
  void join();

 private:
  bool threads_done();  // waits a little for the threads; true once all have returned
  void notice_signal(int sig);
  bool must_abandon(int sig);

  const CampaignOptions& opts_;
  Console& console_;
  Clock::time_point t0_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> time_up_{false};
  std::optional<Clock::time_point> stop_seen_;
  std::function<void(int)> work_;  // kept here: abandoned threads may still run it
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  int threads_running_ = 0;
};

}  // namespace mlafuzz::campaign
