// util::DataRoots: a data path is opened beneath its root without following
// any link (issue 25.8), excluded paths are never opened (issue 25.3), and a
// directory swapped for a link while files are opened never leads out.
#include "util/data_roots.h"

#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace fxdp::util {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;
using ::testing::HasSubstr;

void Write(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

struct Tree {
  std::string root, outside;
};

// root/sub/f, root/state/job.safetensors, root/key; outside/secret,
// outside/d/f; links: root/abs -> outside/secret, root/dirlink -> outside,
// root/rel -> sub (a relative link that stays inside).
Tree MakeTree(const std::string& name) {
  Tree t{::testing::TempDir() + "/" + name + "_root",
         ::testing::TempDir() + "/" + name + "_outside"};
  const std::string cmd = absl::StrCat("rm -rf ", t.root, " ", t.outside, " && mkdir -p ", t.root,
                                       "/sub ", t.root, "/state ", t.outside, "/d");
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  Write(t.root + "/sub/f", "inside");
  Write(t.root + "/state/job.safetensors", "alice's weights");
  Write(t.root + "/key", "private key");
  Write(t.outside + "/secret", "outside");
  Write(t.outside + "/d/f", "outside");
  EXPECT_EQ(symlink((t.outside + "/secret").c_str(), (t.root + "/abs").c_str()), 0);
  EXPECT_EQ(symlink(t.outside.c_str(), (t.root + "/dirlink").c_str()), 0);
  EXPECT_EQ(symlink("sub", (t.root + "/rel").c_str()), 0);
  return t;
}

std::string Contents(const RegularFile& f) {
  std::string s(f.size(), '\0');
  EXPECT_TRUE(f.ReadAt(0, f.size(), s.data()).ok());
  return s;
}

TEST(DataRoots, OpensBeneathTheRootAndFollowsNoLink) {
  const Tree t = MakeTree("dr_links");
  const DataRoots roots = ValueOrDie(DataRoots::Open({t.root}));
  EXPECT_EQ(Contents(ValueOrDie(roots.OpenFile(t.root + "/sub/f", 100))), "inside");
  EXPECT_EQ(Contents(ValueOrDie(roots.OpenFile(t.root + "/sub/../sub/./f", 100))), "inside");
  const auto kDenied = absl::StatusCode::kPermissionDenied;
  // '..' out of the root, lexically: refused before anything is looked up.
  EXPECT_THAT(
      roots.OpenFile(t.root + "/../" + t.outside.substr(t.outside.rfind('/') + 1) + "/secret", 100)
          .status(),
      StatusIs(kDenied, "is outside this worker's data roots"));
  EXPECT_THAT(roots.OpenFile("/etc/passwd", 100).status(),
              StatusIs(kDenied, "is outside this worker's data roots"));
  // An absolute link, a linked directory out, a relative link that stays in.
  for (const std::string p : {"/abs", "/dirlink/secret", "/rel/f"}) {
    EXPECT_THAT(roots.OpenFile(t.root + p, 100).status(),
                StatusIs(kDenied, "goes through a symbolic link"))
        << p;
  }
  EXPECT_THAT(roots.OpenFile(t.root + "/missing", 100).status(),
              StatusIs(absl::StatusCode::kNotFound, "does not exist under the data roots"));
  EXPECT_THAT(roots.OpenFile(t.root, 100).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "a directory"));
  EXPECT_THAT(roots.OpenFile(t.root + "/sub", 100).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "a directory"));
  EXPECT_THAT(roots.OpenFile(t.root + "/sub/f", 3).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "has 6 bytes, over the limit of 3"));
  EXPECT_THAT(DataRoots().OpenFile(t.root + "/sub/f", 100).status(),
              StatusIs(kDenied, "none were configured"));
}

// IsDirectory (a dataset directory, docs/datasets.md) under OpenFile's rules:
// the same refusals outside the roots, through links and when missing.
TEST(DataRoots, IsDirectoryFollowsOpenFilesRules) {
  const Tree t = MakeTree("dr_isdir");
  const DataRoots roots = ValueOrDie(DataRoots::Open({t.root}, {t.root + "/state"}));
  EXPECT_TRUE(ValueOrDie(roots.IsDirectory(t.root)));
  EXPECT_TRUE(ValueOrDie(roots.IsDirectory(t.root + "/sub")));
  EXPECT_FALSE(ValueOrDie(roots.IsDirectory(t.root + "/sub/f")));
  const auto kDenied = absl::StatusCode::kPermissionDenied;
  EXPECT_THAT(roots.IsDirectory(t.outside).status(),
              StatusIs(kDenied, "is outside this worker's data roots"));
  EXPECT_THAT(roots.IsDirectory(t.root + "/dirlink").status(),
              StatusIs(kDenied, "goes through a symbolic link"));
  EXPECT_THAT(roots.IsDirectory(t.root + "/state").status(),
              StatusIs(kDenied, "never reads data from"));
  EXPECT_THAT(roots.IsDirectory(t.root + "/missing").status(),
              StatusIs(absl::StatusCode::kNotFound, "does not exist under the data roots"));
}

// The two ways of opening beneath a root (openat2, and the O_NOFOLLOW walk
// of kernels without it) refuse the same links.
TEST(DataRoots, Openat2AndTheWalkRefuseTheSameLinks) {
  const Tree t = MakeTree("dr_walk");
  const int root = open(t.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(root, 0);
  for (const bool openat2 : {true, false}) {
    const int fd = internal::OpenBeneath(root, "sub/f", O_RDONLY | O_CLOEXEC, openat2);
    EXPECT_GE(fd, 0) << openat2;
    if (fd >= 0) close(fd);
    for (const char* p : {"abs", "dirlink/secret", "rel/f"})
      EXPECT_EQ(internal::OpenBeneath(root, p, O_RDONLY | O_CLOEXEC, openat2), -ELOOP)
          << p << " " << openat2;
    EXPECT_EQ(internal::OpenBeneath(root, "nope/f", O_RDONLY | O_CLOEXEC, openat2), -ENOENT)
        << openat2;
  }
  close(root);
}

TEST(DataRoots, ExcludedPathsAreNeverOpened) {
  const Tree t = MakeTree("dr_excl");
  ASSERT_EQ(link((t.root + "/key").c_str(), (t.root + "/sub/key-hardlink").c_str()), 0);
  Write(t.root + "/statefile", "not in the state dir");
  const DataRoots roots =
      ValueOrDie(DataRoots::Open({t.root}, {t.root + "/state", t.root + "/key"}));
  const auto kDenied = absl::StatusCode::kPermissionDenied;
  EXPECT_THAT(roots.OpenFile(t.root + "/state/job.safetensors", 100).status(),
              StatusIs(kDenied, absl::StrCat("'", t.root, "/state/job.safetensors' is in '")));
  EXPECT_THAT(roots.OpenFile(t.root + "/sub/../state/job.safetensors", 100).status(),
              StatusIs(kDenied, "never reads"));
  EXPECT_THAT(roots.OpenFile(t.root + "/state/missing", 100).status(),
              StatusIs(kDenied, "never reads"));
  EXPECT_THAT(roots.OpenFile(t.root + "/key", 100).status(), StatusIs(kDenied, "never reads"));
  EXPECT_THAT(roots.OpenFile(t.root + "/sub/key-hardlink", 100).status(),
              StatusIs(kDenied, "never reads"));
  EXPECT_EQ(Contents(ValueOrDie(roots.OpenFile(t.root + "/statefile", 100))),
            "not in the state dir");
  // A NUL would end the path for the kernel where the checks see more:
  // "state/job.safetensors\0/../../statefile" is "statefile" to them.
  EXPECT_THAT(
      roots.OpenFile(t.root + std::string("/state/job.safetensors\0/../../statefile", 39), 100)
          .status(),
      StatusIs(absl::StatusCode::kInvalidArgument, "contains a NUL byte"));
  // A root spelled through a link is the same root: its exclusions hold.
  const std::string alias = t.outside + "/root-alias";
  ASSERT_EQ(symlink(t.root.c_str(), alias.c_str()), 0);
  const DataRoots aliased = ValueOrDie(DataRoots::Open({alias}, {t.root + "/state"}));
  EXPECT_THAT(aliased.OpenFile(alias + "/state/job.safetensors", 100).status(),
              StatusIs(kDenied, "never reads"));
  EXPECT_EQ(Contents(ValueOrDie(aliased.OpenFile(alias + "/sub/f", 100))), "inside");
}

// Issue 25.8: root/d is swapped between a directory and a link to
// outside/d (renameat2 RENAME_EXCHANGE, as fast as it goes) while root/d/f
// is opened 500 times: every descriptor is the inside file (by inode), never
// the outside one; the rest are refused as a link on the way.
TEST(DataRoots, ASwappedInLinkNeverLeadsOut) {
  const Tree t = MakeTree("dr_race");
  ASSERT_EQ(mkdir((t.root + "/d").c_str(), 0755), 0);
  Write(t.root + "/d/f", "inside");
  ASSERT_EQ(symlink((t.outside + "/d").c_str(), (t.root + "/alt").c_str()), 0);
  struct stat in {
  }, out{};
  ASSERT_EQ(stat((t.root + "/d/f").c_str(), &in), 0);
  ASSERT_EQ(stat((t.outside + "/d/f").c_str(), &out), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::thread swapper([&] {
    while (!stop.load()) {
      if (renameat2(AT_FDCWD, (t.root + "/d").c_str(), AT_FDCWD, (t.root + "/alt").c_str(),
                    RENAME_EXCHANGE) == 0)
        ++swaps;
    }
  });
  const DataRoots roots = ValueOrDie(DataRoots::Open({t.root}));
  const int root = open(t.root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  int opened = 0, inside = 0, refused = 0;
  while (swaps.load() == 0) sched_yield();  // the swapper runs
  for (int i = 0; i < 500; ++i) {
    sched_yield();  // lets the swapper in between opens on a busy machine
    for (const bool openat2 : {true, false}) {
      const int fd = internal::OpenBeneath(root, "d/f", O_RDONLY | O_CLOEXEC, openat2);
      if (fd < 0) {
        EXPECT_TRUE(fd == -ELOOP || fd == -ENOENT) << fd;
        ++refused;
        continue;
      }
      struct stat st {};
      ASSERT_EQ(fstat(fd, &st), 0);
      close(fd);
      ++opened;
      EXPECT_FALSE(st.st_dev == out.st_dev && st.st_ino == out.st_ino)
          << "opened the file outside the root";
      inside += st.st_dev == in.st_dev && st.st_ino == in.st_ino;
    }
    absl::StatusOr<RegularFile> f = roots.OpenFile(t.root + "/d/f", 100);
    if (f.ok()) {
      EXPECT_EQ(Contents(*f), "inside");
    } else {
      EXPECT_THAT(f.status().message(), HasSubstr("symbolic link")) << f.status();
    }
  }
  stop = true;
  swapper.join();
  close(root);
  EXPECT_EQ(inside, opened);
  EXPECT_GT(swaps.load(), 0);
  std::printf("swaps %d, opened %d (all inside), refused %d\n", swaps.load(), opened, refused);
}

}  // namespace
}  // namespace fxdp::util
