// util::DataRoots::CreateFile and Remove (the checkpoints a worker writes,
// docs/checkpoints.md): a file is created only beneath its root, through no
// link (also one swapped in while files are created), never over an existing
// file, never at a path with "." or "..", never in an excluded directory,
// and never longer than its limit; it appears only once complete.
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"
#include "util/data_roots.h"

namespace fxdp::util {
namespace {

using ::fxdp::testing::StatusIs;
using ::fxdp::testing::ValueOrDie;

struct Tree {
  std::string root, outside;
};

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteText(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// root/sub/f ("mine"), root/state/ (excluded), outside/secret ("secret");
// root/dirlink -> outside, root/rel -> sub, root/abs -> outside/secret.
Tree MakeTree(const std::string& name) {
  Tree t{::testing::TempDir() + "/" + name + "_root",
         ::testing::TempDir() + "/" + name + "_outside"};
  EXPECT_EQ(std::system(absl::StrCat("rm -rf ", t.root, " ", t.outside, " && mkdir -p ", t.root,
                                     "/sub ", t.root, "/state ", t.outside)
                            .c_str()),
            0);
  WriteText(t.root + "/sub/f", "mine");
  WriteText(t.outside + "/secret", "secret");
  EXPECT_EQ(symlink(t.outside.c_str(), (t.root + "/dirlink").c_str()), 0);
  EXPECT_EQ(symlink("sub", (t.root + "/rel").c_str()), 0);
  EXPECT_EQ(symlink((t.outside + "/secret").c_str(), (t.root + "/abs").c_str()), 0);
  return t;
}

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.insert(n);
  }
  closedir(d);
  return out;
}

TEST(DataRootsWrite, CreatesDirectoriesAndTheFileOnlyWhenCommitted) {
  const Tree t = MakeTree("drw_ok");
  const DataRoots roots = ValueOrDie(DataRoots::Open({t.root}));
  const std::string path = t.root + "/ck/step-1/rank-0-of-2.safetensors";
  {
    NewFile f = ValueOrDie(roots.CreateFile(path, 100));
    ASSERT_TRUE(f.Write("abc").ok());
    ASSERT_TRUE(f.Write("de").ok());
    EXPECT_EQ(access(path.c_str(), F_OK), -1);  // not before Commit
    ASSERT_TRUE(f.Commit().ok());
    EXPECT_EQ(f.written(), 5u);
  }
  EXPECT_EQ(Read(path), "abcde");
  EXPECT_EQ(Entries(t.root + "/ck/step-1"), std::set<std::string>{"rank-0-of-2.safetensors"});
  // A second file in the existing directories; one never committed leaves nothing.
  ASSERT_TRUE(ValueOrDie(roots.CreateFile(t.root + "/ck/step-1/b", 10)).Commit().ok());
  { NewFile dropped = ValueOrDie(roots.CreateFile(t.root + "/ck/step-1/c", 10)); }
  EXPECT_EQ(Entries(t.root + "/ck/step-1"),
            (std::set<std::string>{"b", "rank-0-of-2.safetensors"}));
  // Its limit.
  NewFile small = ValueOrDie(roots.CreateFile(t.root + "/ck/small", 4));
  EXPECT_THAT(small.Write("12345"),
              StatusIs(absl::StatusCode::kResourceExhausted, "would pass its limit of 4"));
}

TEST(DataRootsWrite, NeverWritesOverAnExistingFileOrLink) {
  const Tree t = MakeTree("drw_exists");
  const DataRoots roots = ValueOrDie(DataRoots::Open({t.root}));
  const auto kExists = absl::StatusCode::kAlreadyExists;
  EXPECT_THAT(roots.CreateFile(t.root + "/sub/f", 100).status(), StatusIs(kExists, "a file"));
  EXPECT_THAT(roots.CreateFile(t.root + "/abs", 100).status(),
              StatusIs(kExists, "a symbolic link"));
  EXPECT_THAT(roots.CreateFile(t.root + "/sub", 100).status(), StatusIs(kExists, "a directory"));
  EXPECT_EQ(Read(t.root + "/sub/f"), "mine");
  EXPECT_EQ(Read(t.outside + "/secret"), "secret");
  // A file that appears while another is written is not replaced either.
  NewFile racing = ValueOrDie(roots.CreateFile(t.root + "/sub/g", 100));
  ASSERT_TRUE(racing.Write("new").ok());
  WriteText(t.root + "/sub/g", "theirs");
  EXPECT_THAT(racing.Commit(), StatusIs(kExists, "appeared while it was written"));
  EXPECT_EQ(Read(t.root + "/sub/g"), "theirs");
  EXPECT_EQ(Entries(t.root + "/sub"), (std::set<std::string>{"f", "g"}));
  // A file on the way is not a directory.
  EXPECT_THAT(roots.CreateFile(t.root + "/sub/f/x", 100).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "is not a directory"));
}

TEST(DataRootsWrite, RefusesDotsOutsideLinksAndExcludedPaths) {
  const Tree t = MakeTree("drw_refuse");
  const DataRoots roots = ValueOrDie(DataRoots::Open({t.root}, {t.root + "/state"}));
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  const auto kDenied = absl::StatusCode::kPermissionDenied;
  const struct {
    std::string path;
    absl::StatusCode code;
    const char* message;
  } kRefused[] = {
      // '..' and '.', even where they would stay inside.
      {t.root + "/sub/../x", kInvalid, "has a '..' component"},
      {t.root + "/../x", kInvalid, "has a '..' component"},
      {t.root + "/./x", kInvalid, "has a '.' component"},
      // An absolute path outside, a link to a directory outside, a link that stays inside.
      {t.outside + "/x", kDenied, "outside this worker's data roots"},
      {t.root + "/dirlink/x", kDenied, "goes through a symbolic link ('dirlink')"},
      {t.root + "/dirlink/new/x", kDenied, "symbolic link"},
      {t.root + "/rel/x", kDenied, "symbolic link"},
      {t.root + "/state/x", kDenied, "never reads data from"},
      {t.root, kInvalid, "a data root itself"},
      {t.root + std::string("/x\0/../y", 8), kInvalid, "contains a NUL byte"},
      {t.root + "/" + std::string(5000, 'a'), kInvalid, "longer than PATH_MAX"},
  };
  for (const auto& c : kRefused)
    EXPECT_THAT(roots.CreateFile(c.path, 100).status(), StatusIs(c.code, c.message)) << c.path;
  EXPECT_THAT(DataRoots().CreateFile(t.root + "/x", 100).status(),
              StatusIs(kDenied, "none were configured"));
  EXPECT_EQ(Entries(t.outside), std::set<std::string>{"secret"});
  EXPECT_EQ(Entries(t.root + "/state"), std::set<std::string>{});
  EXPECT_EQ(Entries(t.root + "/sub"), std::set<std::string>{"f"});
}

TEST(DataRootsWrite, RemovesFilesLinksAndEmptyDirectoriesOnly) {
  const Tree t = MakeTree("drw_remove");
  const DataRoots roots = ValueOrDie(DataRoots::Open({t.root}));
  ASSERT_TRUE(roots.Remove(t.root + "/abs", false).ok());  // the link, not its target
  EXPECT_EQ(Read(t.outside + "/secret"), "secret");
  EXPECT_THAT(roots.Remove(t.root + "/dirlink/secret", false),
              StatusIs(absl::StatusCode::kPermissionDenied, "symbolic link"));
  EXPECT_THAT(roots.Remove(t.root + "/sub", true),
              StatusIs(absl::StatusCode::kFailedPrecondition, "only an empty directory"));
  EXPECT_THAT(roots.Remove(t.root + "/sub", false),
              StatusIs(absl::StatusCode::kFailedPrecondition, "only a file or a link"));
  EXPECT_THAT(roots.Remove(t.root + "/sub/missing", false),
              StatusIs(absl::StatusCode::kNotFound, "does not exist"));
  EXPECT_THAT(roots.Remove(t.root + "/nodir/x", false),
              StatusIs(absl::StatusCode::kNotFound, "does not exist"));
  ASSERT_TRUE(roots.Remove(t.root + "/sub/f", false).ok());
  ASSERT_TRUE(roots.Remove(t.root + "/sub", true).ok());
  EXPECT_EQ(Entries(t.outside), std::set<std::string>{"secret"});
  EXPECT_EQ(access((t.root + "/sub").c_str(), F_OK), -1);
}

// root/ck is swapped between a directory and a link to outside
// (renameat2 RENAME_EXCHANGE, as fast as it goes) while files are created
// under it 300 times: every one lands inside or is refused (a link on the
// way); nothing is ever created outside.
TEST(DataRootsWrite, ASwappedInLinkNeverLeadsOut) {
  const Tree t = MakeTree("drw_race");
  ASSERT_EQ(mkdir((t.root + "/ck").c_str(), 0755), 0);
  ASSERT_EQ(symlink(t.outside.c_str(), (t.root + "/alt").c_str()), 0);
  std::atomic<bool> stop{false};
  std::atomic<int> swaps{0};
  std::thread swapper([&] {
    while (!stop.load()) {
      if (renameat2(AT_FDCWD, (t.root + "/ck").c_str(), AT_FDCWD, (t.root + "/alt").c_str(),
                    RENAME_EXCHANGE) == 0)
        ++swaps;
    }
  });
  const DataRoots roots = ValueOrDie(DataRoots::Open({t.root}));
  int created = 0, refused = 0;
  while (swaps.load() == 0) sched_yield();
  for (int i = 0; i < 300; ++i) {
    sched_yield();
    absl::StatusOr<NewFile> f = roots.CreateFile(absl::StrCat(t.root, "/ck/s", i, "/f"), 100);
    if (!f.ok()) {
      // A link on the way; or, when it was swapped back between the open and the look at
      // what refused it, "not a directory".
      const bool link = f.status().code() == absl::StatusCode::kPermissionDenied &&
                        absl::StrContains(f.status().message(), "symbolic link ('ck')");
      const bool changed = f.status().code() == absl::StatusCode::kFailedPrecondition &&
                           absl::StrContains(f.status().message(), "'ck' on its way");
      EXPECT_TRUE(link || changed) << f.status();
      ++refused;
      continue;
    }
    ASSERT_TRUE(f->Write("x").ok());
    ASSERT_TRUE(f->Commit().ok());
    ++created;
  }
  stop = true;
  swapper.join();
  EXPECT_EQ(Entries(t.outside), std::set<std::string>{"secret"});
  EXPECT_GT(swaps.load(), 0);
  std::printf("swaps %d, created %d (all inside), refused %d\n", swaps.load(), created, refused);
}

}  // namespace
}  // namespace fxdp::util
