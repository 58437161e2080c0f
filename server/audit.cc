#include "server/audit.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/log.h"

namespace fxdp::server {

std::string AuditLine(absl::string_view event, AuditFields fields) {
  std::string line = absl::StrCat("event=\"", absl::CHexEscape(event), "\"");
  for (const auto& [k, v] : fields)
    absl::StrAppend(&line, " ", k, "=\"", absl::CHexEscape(v), "\"");
  return line;
}

void Audit(absl::string_view event, AuditFields fields) {
  Log("audit " + AuditLine(event, fields));
}

}  // namespace fxdp::server
