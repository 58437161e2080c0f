// fxdp-server's flags -> ServerConfig (server/config.h): the defaults, every
// unit conversion (MiB to bytes, ms, seconds, quotas), chunk sizes held under
// --max-message-mb, the usage errors naming the flag and the value, and the
// checks of a parsed config against its security and --local-workers.
#include "server/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fxdp::server {
namespace {

using ::testing::HasSubstr;

// ParseServerConfig's result and what it printed to stderr.
struct Parsed {
  int rc;
  ServerConfig config;
  std::string err;
};

Parsed Parse(const std::vector<std::string>& args) {
  Parsed p;
  ::testing::internal::CaptureStderr();
  p.rc = ParseServerConfig(args, &p.config);
  p.err = ::testing::internal::GetCapturedStderr();
  return p;
}

TEST(ServerConfig, NoFlagsGiveTheDefaults) {
  const Parsed p = Parse({});
  ASSERT_EQ(p.rc, -1) << p.err;
  const ServerConfig& c = p.config;
  EXPECT_EQ(c.listen, "127.0.0.1:50051");
  EXPECT_EQ(c.max_message_bytes, int64_t{1024} << 20);
  EXPECT_EQ(c.local_workers, 0);
  EXPECT_EQ(c.registry.heartbeat_interval_ms, 1000);
  EXPECT_EQ(c.max_data_mb, 4096);
  EXPECT_FALSE(c.insecure);
  EXPECT_TRUE(c.state_dir.empty() && c.data_roots.empty());
  const JobServiceOptions defaults;
  EXPECT_EQ(c.jobs.max_state_bytes, defaults.max_state_bytes);
  EXPECT_EQ(c.jobs.max_queued_jobs, defaults.max_queued_jobs);
  EXPECT_EQ(c.jobs.chunk_bytes, defaults.chunk_bytes);
  EXPECT_EQ(c.jobs.max_fetch_chunk_bytes, kMaxFetchChunkBytes);
}

TEST(ServerConfig, ValuesAreConvertedToThePartsUnits) {
  const Parsed p = Parse({"--listen",
                          "127.0.0.1:0",
                          "--max-message-mb",
                          "64",
                          "--cache-mb",
                          "3",
                          "--cache-entries",
                          "7",
                          "--max-graph-mb",
                          "5",
                          "--max-world-size",
                          "16",
                          "--max-expanded-mb",
                          "9",
                          "--heartbeat-ms",
                          "250",
                          "--max-worker-streams",
                          "11",
                          "--local-workers",
                          "2",
                          "--max-queued-jobs",
                          "4",
                          "--max-state-mb",
                          "6",
                          "--max-finished-jobs",
                          "8",
                          "--queue-grace-s",
                          "2.5",
                          "--max-initial-state-mb",
                          "12",
                          "--max-batch-mb",
                          "13",
                          "--max-submit-streams-per-identity",
                          "3",
                          "--max-queued-jobs-per-identity",
                          "2",
                          "--max-fetch-streams",
                          "5",
                          "--max-fetch-streams-per-identity",
                          "1",
                          "--max-auth-failures",
                          "0",
                          "--state-dir",
                          "/tmp/x",
                          "--checkpoint-every",
                          "10"});
  ASSERT_EQ(p.rc, -1) << p.err;
  const ServerConfig& c = p.config;
  EXPECT_EQ(c.listen, "127.0.0.1:0");
  EXPECT_EQ(c.max_message_bytes, int64_t{64} << 20);
  EXPECT_EQ(c.cache.max_bytes, int64_t{3} << 20);
  EXPECT_EQ(c.cache.max_entries, 7);
  EXPECT_EQ(c.limits.max_request_bytes, int64_t{5} << 20);
  EXPECT_EQ(c.limits.max_world_size, 16);
  EXPECT_EQ(c.limits.max_expanded_bytes, int64_t{9} << 20);
  EXPECT_EQ(c.registry.heartbeat_interval_ms, 250);
  EXPECT_EQ(c.registry.max_streams, 11);
  EXPECT_EQ(c.local_workers, 2);
  EXPECT_EQ(c.jobs.max_queued_jobs, 4u);
  EXPECT_EQ(c.jobs.max_state_bytes, uint64_t{6} << 20);
  EXPECT_EQ(c.jobs.max_finished_jobs, 8u);
  EXPECT_EQ(c.jobs.queue_grace_s, 2.5);
  EXPECT_EQ(c.jobs.max_initial_state_bytes, uint64_t{12} << 20);
  EXPECT_EQ(c.jobs.max_batch_bytes, uint64_t{13} << 20);
  EXPECT_EQ(c.jobs.max_submit_streams_per_identity, 3u);
  EXPECT_EQ(c.jobs.max_queued_jobs_per_identity, 2u);
  EXPECT_EQ(c.jobs.max_fetch_streams, 5u);
  EXPECT_EQ(c.jobs.max_fetch_streams_per_identity, 1u);
  EXPECT_EQ(c.security.auth_limits.max_failures, 0);
  EXPECT_EQ(c.state_dir, "/tmp/x");
  EXPECT_EQ(c.jobs.checkpoint_every, 10);
}

// A message of --max-message-mb 1 holds a chunk and its headroom: chunks shrink to fit.
TEST(ServerConfig, ChunksStayUnderTheMessageLimit) {
  const Parsed p = Parse({"--max-message-mb", "1"});
  ASSERT_EQ(p.rc, -1) << p.err;
  const size_t most = (size_t{1} << 20) - kMessageHeadroomBytes;
  EXPECT_EQ(p.config.jobs.chunk_bytes, most);
  EXPECT_EQ(p.config.jobs.max_fetch_chunk_bytes, most);
}

TEST(ServerConfig, UsageErrorsNameTheFlagAndTheValue) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--max-message-mb", "0"}, "--max-message-mb needs an integer in [1, 2047], got '0'"},
      {{"--max-message-mb", "2048"}, "--max-message-mb needs an integer in [1, 2047], got '2048'"},
      {{"--heartbeat-ms", "x"}, "--heartbeat-ms needs an integer in [1, 3600000], got 'x'"},
      {{"--max-queued-jobs", "0"}, "--max-queued-jobs needs an integer >= 1, got '0'"},
      {{"--queue-grace-s", "0"}, "--queue-grace-s needs a number of seconds in (0, 31536000]"},
      {{"--local-workers", "257"}, "--local-workers needs an integer in [0, 256], got '257'"},
      {{"--data-root", "/nonexistent/fxdp"}, "--data-root needs an existing directory"},
      {{"--worker-memory-limit", "lots"}, "--worker-memory-limit needs a size in bytes"},
      {{"--listen", ""}, "--listen needs HOST:PORT, got ''"},
      {{"--listen"}, "--listen needs HOST:PORT"},
      {{"--bogus"}, "unknown argument '--bogus'"},
  };
  for (const auto& [args, want] : cases) {
    const Parsed p = Parse(args);
    EXPECT_EQ(p.rc, 2) << args[0];
    EXPECT_THAT(p.err, HasSubstr("fxdp-server: " + want)) << args[0];
    EXPECT_THAT(p.err, HasSubstr("usage: fxdp-server")) << args[0];
  }
}

TEST(ServerConfig, HelpAndVersionExitZero) {
  for (const char* flag : {"--help", "--version"}) {
    ServerConfig c;
    ::testing::internal::CaptureStdout();
    EXPECT_EQ(ParseServerConfig({flag}, &c), 0) << flag;
    const std::string out = ::testing::internal::GetCapturedStdout();
    EXPECT_THAT(out,
                HasSubstr(std::string(flag) == "--help" ? "usage: fxdp-server" : "fxdp-server "))
        << flag;
  }
}

TEST(ServerConfig, ChecksNameWhatIsMissing) {
  ServerConfig c;
  EXPECT_EQ(CheckServerConfig(false, false, &c), "");
  c.listen = "0.0.0.0:50051";
  EXPECT_THAT(CheckServerConfig(false, false, &c), HasSubstr("is not a loopback address"));
  EXPECT_EQ(CheckServerConfig(true, false, &c), "");  // TLS
  c.insecure = true;
  EXPECT_EQ(CheckServerConfig(false, false, &c), "");
  ServerConfig m;
  m.worker_memory_limit = "1GiB";
  EXPECT_THAT(CheckServerConfig(false, false, &m),
              HasSubstr("--worker-memory-limit applies to --local-workers"));
  ServerConfig w;
  w.local_workers = 1;
  EXPECT_THAT(CheckServerConfig(true, false, &w),
              HasSubstr("--local-workers with TLS need --tls-ca"));
  w.security.tls_ca = "ca.pem";
  EXPECT_THAT(CheckServerConfig(true, true, &w),
              HasSubstr("--local-workers with authentication need --worker-token-file"));
  w.worker_binary = "/nonexistent/fxdp-worker";
  EXPECT_THAT(
      CheckServerConfig(false, false, &w),
      HasSubstr("--local-workers: no executable fxdp-worker at '/nonexistent/fxdp-worker'"));
  ServerConfig k;
  k.jobs.checkpoint_every = 5;
  EXPECT_THAT(CheckServerConfig(false, false, &k),
              HasSubstr("--checkpoint-every needs --state-dir"));
}

}  // namespace
}  // namespace fxdp::server
