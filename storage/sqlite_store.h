// SQLite-specific entry points beyond OpenSqliteStore (store.h): the schema's
// history and a way to open a database against a different history, which
// tests of the migration mechanism need.
//
// Schema changes are migrations: each has the next version number and SQL
// run in one transaction together with the version bump, so a database is
// always at exactly one version. Opening a database applies every migration
// newer than its version; opening one newer than this binary knows fails
// (an old binary must not write to a schema it does not understand).
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "storage/store.h"

namespace kforge {

struct Migration {
  int version = 0;         // 1, 2, 3, ... with no gaps
  std::string_view what;   // one line, for errors
  std::string_view sql;    // one or more statements
};

// kforge's schema history, oldest first; the last version is the current one.
std::span<const Migration> SqliteMigrations();

struct SqliteOptions {
  // An existing file that holds no kforge database (zero bytes, an SQLite
  // file without tables, another application's database) is refused with
  // FAILED_PRECONDITION unless this is set: such a file is a wrong path, a
  // truncated copy or a failed restore far more often than a wish to start
  // over, and starting over in it would hide that. A missing file is
  // created (mode 600) either way; a file that is not SQLite is refused
  // either way.
  bool init = false;
  // The consistency check at open, before anything is written: a file that
  // fails it is DATA_LOSS, naming the problems. kQuick is PRAGMA
  // quick_check (linear in the file's size; everything but index contents),
  // kFull is integrity_check.
  enum class Check { kOff, kQuick, kFull };
  Check check = Check::kQuick;
  // How long a call waits for another process's write lock before it
  // fails with UNAVAILABLE.
  int busy_timeout_ms = 5000;
  // The history to migrate to. Must outlive OpenSqliteStore (the store does
  // not keep it).
  std::span<const Migration> migrations = SqliteMigrations();
};

absl::StatusOr<std::unique_ptr<Store>> OpenSqliteStore(const std::string& path,
                                                       const SqliteOptions& options);

}  // namespace kforge
