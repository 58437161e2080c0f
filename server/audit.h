// The audit log: one line per security-relevant event (job submit, cancel,
// fetch; worker join, leave) on the server's log, with who did it:
//
//   fxdp-server: audit event="submit" identity="alice" peer="ipv4:10.0.0.7:51234" job="job-3"
//
// Every value is quoted and escaped (absl::CHexEscape: quotes, backslashes,
// control characters and non-ASCII bytes become \" \\ \n \xHH), so a value a
// client or worker chose (a job name, a hostname with a newline) can neither
// start a new line nor forge another field. Keys are fixed by the caller.
#ifndef FXDP_SERVER_AUDIT_H_
#define FXDP_SERVER_AUDIT_H_

#include <initializer_list>
#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace fxdp::server {

using AuditFields = std::initializer_list<std::pair<absl::string_view, absl::string_view>>;

// `event="EVENT" k1="v1" ...` with every value escaped.
std::string AuditLine(absl::string_view event, AuditFields fields);

// Logs "audit " + AuditLine(...).
void Audit(absl::string_view event, AuditFields fields);

}  // namespace fxdp::server

#endif  // FXDP_SERVER_AUDIT_H_
