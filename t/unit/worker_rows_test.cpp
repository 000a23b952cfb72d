// Worker rows: in-flight counts that a dead worker's survivors give back.
#include <set>
#include <vector>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "affinity_core.h"
#include "test_support.h"

using namespace affinity_test;

namespace {

// A process that exists, then does not: a child that waits to be killed.
class ChildProcess {
public:
    ChildProcess()
    {
        pid_ = fork();
        if (pid_ == 0) {
            pause();
            _exit(0);
        }
        start_ = affinity_process_start(uint64_t(pid_));
    }

    ~ChildProcess() { kill_now(); }

    uint64_t pid() const { return uint64_t(pid_); }
    uint64_t start() const { return start_; }

    void kill_now()
    {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
    }

private:
    pid_t pid_;
    uint64_t start_;
};

int64_t inflight(const Upstream &up, size_t i)
{
    return up.stats(i).inflight;
}

// Frees the rows of the dead, as the module's reaping worker does.
uint64_t reap_dead(affinity_zone_t *zone)
{
    affinity_worker_t workers[AFFINITY_MAX_WORKER_ROWS];
    size_t n = affinity_zone_workers(zone, workers, AFFINITY_MAX_WORKER_ROWS);
    uint64_t recovered = 0;

    for (size_t i = 0; i < n; i++) {
        uint64_t given = 0;

        if (!affinity_process_alive(workers[i].pid, workers[i].start)
            && affinity_zone_worker_reap(zone, &workers[i], &given))
        {
            recovered += given;
        }
    }
    return recovered;
}

TEST(Process, StartTimeTellsAProcessFromItsPid)
{
    uint64_t self = uint64_t(getpid());
    uint64_t start = affinity_process_start(self);

    ASSERT_GT(start, 0u) << "Linux tells the start time in /proc";
    EXPECT_TRUE(affinity_process_alive(self, start));
    EXPECT_TRUE(affinity_process_alive(self, 0));
    EXPECT_FALSE(affinity_process_alive(self, start + 1))
        << "another process that got the pid";
    EXPECT_FALSE(affinity_process_alive(0, 0));
}

TEST(Process, AKilledChildIsDead)
{
    ChildProcess child;
    ASSERT_GT(child.start(), 0u);
    EXPECT_TRUE(affinity_process_alive(child.pid(), child.start()));

    uint64_t pid = child.pid();
    child.kill_now();
    EXPECT_FALSE(affinity_process_alive(pid, child.start()));
    EXPECT_FALSE(affinity_process_alive(pid, 0));
}

TEST(Process, AZombieIsDead)
{
    // Killed but not collected by its parent yet: the master collects its
    // workers at once, but the check must not wait for it.
    pid_t pid = fork();
    if (pid == 0) {
        pause();
        _exit(0);
    }
    uint64_t start = affinity_process_start(uint64_t(pid));
    kill(pid, SIGKILL);

    // until the kernel has made it a zombie
    for (int i = 0; i < 1000 && affinity_process_start(uint64_t(pid)) != 0;
         i++) {
        usleep(1000);
    }

    EXPECT_FALSE(affinity_process_alive(uint64_t(pid), start));
    EXPECT_FALSE(affinity_process_alive(uint64_t(pid), 0));
    waitpid(pid, nullptr, 0);
}

TEST(WorkerRows, EachProcessHasItsOwnRow)
{
    TestZone z;
    std::set<uint32_t> rows;

    for (uint64_t pid = 100; pid < 100 + kTestRows; pid++) {
        uint32_t row = affinity_zone_worker_claim(z.get(), pid, 7, 0);
        ASSERT_NE(row, AFFINITY_NO_ROW);
        EXPECT_EQ(affinity_zone_worker_claim(z.get(), pid, 7, 0), row)
            << "claimed again: the same row";
        rows.insert(row);
    }

    EXPECT_EQ(rows.size(), size_t{kTestRows});
    EXPECT_EQ(z.info().rows, kTestRows);
    EXPECT_EQ(z.info().rows_used, kTestRows);

    // All taken: the next worker counts without a row, and it is counted.
    EXPECT_EQ(affinity_zone_worker_claim(z.get(), 999, 7, 0), AFFINITY_NO_ROW);
    EXPECT_EQ(z.info().rows_missing, 1u);

    // A row given back is free for the next worker.
    uint32_t row = affinity_zone_worker_claim(z.get(), 100, 7, 0);
    affinity_zone_worker_release(z.get(), row, 100);
    EXPECT_EQ(z.info().rows_used, kTestRows - 1);
    EXPECT_EQ(affinity_zone_worker_claim(z.get(), 999, 7, 0), row);
}

TEST(WorkerRows, ADeadWorkersRequestsAreGivenBack)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1});
    ChildProcess dying;
    uint64_t self = uint64_t(getpid());

    uint32_t mine = affinity_zone_worker_claim(z.get(), self,
                                               affinity_process_start(self), 0);
    uint32_t theirs = affinity_zone_worker_claim(z.get(), dying.pid(),
                                                 dying.start(), 0);
    ASSERT_NE(mine, AFFINITY_NO_ROW);
    ASSERT_NE(theirs, AFFINITY_NO_ROW);
    ASSERT_NE(mine, theirs);

    // The dying worker routes 7 requests, this one 4; 2 of the dying one's
    // and 1 of this one's end.
    Router router(z.get(), up);
    up.row = theirs;
    std::vector<int> theirs_peers;
    for (int i = 0; i < 7; i++) {
        theirs_peers.push_back(router.route_nokey().decision.peer);
    }
    up.release(size_t(theirs_peers[0]));
    up.release(size_t(theirs_peers[1]));

    up.row = mine;
    std::vector<int> mine_peers;
    for (int i = 0; i < 4; i++) {
        mine_peers.push_back(router.route_nokey().decision.peer);
    }
    up.release(size_t(mine_peers[0]));
    ASSERT_EQ(up.total_inflight(), 5 + 3);

    // Alive: nothing to give back.
    EXPECT_EQ(reap_dead(z.get()), 0u);
    EXPECT_EQ(up.total_inflight(), 8);

    dying.kill_now();
    EXPECT_EQ(reap_dead(z.get()), 5u);
    EXPECT_EQ(up.total_inflight(), 3) << "only this worker's requests";
    EXPECT_EQ(z.info().rows_reaped, 1u);
    EXPECT_EQ(z.info().inflight_recovered, 5u);
    EXPECT_EQ(z.info().rows_used, 1u);

    // Once only; this worker's requests end as usual.
    EXPECT_EQ(reap_dead(z.get()), 0u);
    for (size_t i = 1; i < mine_peers.size(); i++) {
        up.release(size_t(mine_peers[i]));
    }
    for (size_t i = 0; i < up.size(); i++) {
        EXPECT_EQ(inflight(up, i), 0) << "peer " << i;
    }
}

TEST(WorkerRows, AReusedPidIsNotTheDeadWorker)
{
    TestZone z;
    Upstream up(z.get(), {1});
    uint64_t self = uint64_t(getpid());
    uint64_t start = affinity_process_start(self);

    // A row left by an earlier process with this pid (another start time).
    uint32_t row = affinity_zone_worker_claim(z.get(), self, start - 1, 0);
    up.row = row;
    up.acquire(0);
    up.acquire(0);

    EXPECT_EQ(reap_dead(z.get()), 2u);
    EXPECT_EQ(inflight(up, 0), 0);

    // A reap decided on an old snapshot does nothing to the row's new
    // owner (the first free row: the one just reaped).
    affinity_worker_t stale = {row, 0, self, start - 1};
    uint32_t again = affinity_zone_worker_claim(z.get(), self, start, 0);
    ASSERT_EQ(again, row);
    up.row = again;
    up.acquire(0);

    uint64_t given = 12345;
    EXPECT_EQ(affinity_zone_worker_reap(z.get(), &stale, &given), 0);
    EXPECT_EQ(given, 12345u) << "left alone";
    EXPECT_EQ(inflight(up, 0), 1);
}

TEST(WorkerRows, AnExitingWorkerGivesItsRowBack)
{
    TestZone z;
    Upstream up(z.get(), {1, 1});
    uint32_t row = affinity_zone_worker_claim(z.get(), 42, 1, 0);
    up.row = row;
    up.acquire(1);

    // Exiting with a request still counted (a connection closed by
    // worker_shutdown_timeout whose end was not seen): given back too.
    affinity_zone_worker_release(z.get(), row, 42);
    EXPECT_EQ(inflight(up, 1), 0);
    EXPECT_EQ(z.info().rows_used, 0u);

    // Another pid cannot release a row it does not own.
    uint32_t other = affinity_zone_worker_claim(z.get(), 43, 1, 0);
    affinity_zone_worker_release(z.get(), other, 44);
    EXPECT_EQ(z.info().rows_used, 1u);
}

TEST(WorkerRows, OneReaperPerInterval)
{
    TestZone z;

    EXPECT_TRUE(affinity_zone_reap_due(z.get(), 1000, 1));
    EXPECT_FALSE(affinity_zone_reap_due(z.get(), 1000, 1));
    EXPECT_TRUE(affinity_zone_reap_due(z.get(), 1001, 1));
    EXPECT_FALSE(affinity_zone_reap_due(z.get(), 1005, 5));
    EXPECT_TRUE(affinity_zone_reap_due(z.get(), 1006, 5));
}

TEST(WorkerRows, TheBoundHoldsAgainAfterTheDeadAreReaped)
{
    TestZone z;
    Upstream up(z.get(), {1, 1, 1, 1});
    Router router(z.get(), up);

    // Three workers die with requests in flight, unevenly: peer 0 looks
    // full to everyone, and a hot session spills off it at once.
    for (int w = 0; w < 3; w++) {
        ChildProcess dying;
        up.row = affinity_zone_worker_claim(z.get(), dying.pid(),
                                            dying.start(), 0);
        for (int i = 0; i < 6; i++) {
            up.acquire(0);
        }
        up.acquire(size_t(1 + w));
        dying.kill_now();
    }
    up.row = AFFINITY_NO_ROW;
    ASSERT_EQ(inflight(up, 0), 18);

    EXPECT_EQ(reap_dead(z.get()), 21u);
    for (size_t i = 0; i < up.size(); i++) {
        EXPECT_EQ(inflight(up, i), 0) << "peer " << i;
    }
}

}  // namespace
