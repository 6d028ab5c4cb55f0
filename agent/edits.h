// Answers as edits: search/replace blocks against a named parent source, so
// a model can change a 30 KB kernel without writing it out again (and
// without the output-token cost of doing so).
//
// The form, in an answer's text (fenced or not) or as a tool call's
// arguments (model_proposer.h):
//
//   parent: v12
//   <<<<<<< SEARCH
//   exact lines of the parent
//   =======
//   what replaces them
//   >>>>>>> REPLACE
//
// Each SEARCH text must occur in the parent exactly once (after the edits
// before it were applied); a block whose text is not found, or is found
// more than once, is an error naming the block, so the model can be told
// precisely what to fix. Trailing whitespace at line ends is ignored when
// matching, as models often drop it.
//
// Thread-safe: pure functions.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace kforge::agent {

struct SearchReplace {
  std::string search;
  std::string replace;
};

struct ParsedEdits {
  std::string parent;  // the handle after "parent:"; "" when not named
  std::vector<SearchReplace> edits;
};

// The edits of `text`; an empty list when it has none. InvalidArgument for
// a block that is opened and not closed ("edit 2: no ======= line").
absl::StatusOr<ParsedEdits> ParseEdits(std::string_view text);

// `parent` with every edit applied in order. InvalidArgument naming the
// edit: "edit 3: the SEARCH text is not in the parent (its first line:
// ...)", "... occurs 2 times; include more lines to make it unique".
absl::StatusOr<std::string> ApplyEdits(std::string_view parent, const std::vector<SearchReplace>& edits);

// A unified diff (3 lines of context) from `a` to `b`, at most `max_lines`
// lines (then cut, saying so); "" when they are equal. For showing one
// variant as a change of another in a prompt.
std::string LineDiff(std::string_view a, std::string_view b, size_t max_lines = 200);

}  // namespace kforge::agent
