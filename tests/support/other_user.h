// The hostile neighbour of docs/security.md: code run as a second, unprivileged local user.
//
// Cohort promises that another local user can neither stop, join nor write into a job. The tests
// of that promise run the attacker's moves (squatting a name, planting a symlink, pre-creating a
// file) in a child process that has dropped to another uid, and then run the victim (this test, as
// root in CI) as usual. The other user is "nobody" (uid 65534 on Debian) when it exists, else uid
// 65534 without a passwd entry: setuid needs no account, and a message then names the bare uid.
//
// Dropping privileges needs real root (CAP_SETUID over every uid): Bazel's linux-sandbox maps only
// uid 0 into its user namespace, so such tests carry tags = ["no-sandbox"]. Where it is impossible
// (not root), otherUser() says why and the test calls GTEST_SKIP() with that reason.
// Thread safety: runAsOtherUser forks; call it from the test's main thread.
//
//   std::string why;
//   auto other = otherUser(&why);
//   if (!other) GTEST_SKIP() << why;
//   ASSERT_EQ(runAsOtherUser(*other, [&] { return ::mkdir(dir.c_str(), 0777) == 0 ? 0 : 1; }), 0);
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>

namespace cohort::testing {

struct OtherUser {
  uid_t uid = 65534;
  gid_t gid = 65534;
  std::string name;  // "nobody", or "uid 65534" without a passwd entry
};

// The other user, or nullopt with `whyNot` set when this process cannot become it (checked by
// trying, in a child, exactly what runAsOtherUser does).
std::optional<OtherUser> otherUser(std::string* whyNot);

// Forks; the child drops every group and becomes `user` (setgroups, setgid, setuid, in that order,
// each checked), runs `fn` and exits with its return value (127 when dropping failed, 126 when fn
// threw). Returns the child's exit status, or -1 when it was killed by a signal; the child is
// SIGKILLed after `timeoutSeconds` (a move that hangs is a test failure, never a hung test).
int runAsOtherUser(const OtherUser& user, const std::function<int()>& fn, int timeoutSeconds = 60);

// Makes `path` (a file or directory this process created) usable by the other user: chown to it.
// For directories an attacker is to write in, as if the attacker had made them.
void giveToOtherUser(const OtherUser& user, const std::string& path);

}  // namespace cohort::testing
