// The Lua around a tag's script (design/tags.md "What a script sees"). The prelude is one line,
// so the script's line N is line N of the chunk and error messages name the user's lines.
#pragma once

#include <string>
#include <string_view>

namespace outrun::tags::detail {

// The evaluation's context arrives as the input `__c` (a map):
//   s  status code per input name      t  source time per input name (seconds since 1970)
//   p  the previous output {value, status, source_time}   n  now (seconds since 1970)
//   (s, t and p are sent only to scripts whose source mentions status, source_time or prev.)
//   m  "c": compile check only, "x": export `state`, absent: run
//   st a state to start from      k  the host keeps a state (a fresh worker asks for it)
//   ks return `state` with the result (keep_state)
// The result is the script's value itself when it returned no status and no state is returned;
// otherwise a map with keys that start with a NUL byte (no script result has them by accident):
// "\0v" value, "\0s" status, "\0st" state, "\0ns" need state, "\0m" mode done.
// `StatusCode` is made once per state by the sandbox (("")["\0StatusCode"], worker/sandbox.cpp):
// an empty table that looks each name up in the generated table on its first read.
inline constexpr std::string_view kPrelude =
    "local __c = inputs.__c; inputs.__c = nil; "
    "if StatusCode == nil then StatusCode = ('')['\\0StatusCode'](); "
    "function severity(c) local s = (c or 0) >> 30; if s == 0 then return 'good' elseif s == 1 "
    "then "
    "return 'uncertain' else return 'bad' end end; "
    "function is_good(c) return (c or 0) >> 30 == 0 end; "
    "function is_uncertain(c) return (c or 0) >> 30 == 1 end; "
    "function is_bad(c) return (c or 0) >> 30 >= 2 end end; "
    "if __c.st ~= nil then state = __c.st elseif state == nil then "
    "if __c.k then return {['\\0ns'] = true} end; state = {} end; "
    "if __c.m == 'c' then return {['\\0m'] = true} elseif __c.m == 'x' then "
    "return {['\\0m'] = true, ['\\0st'] = state} end; "
    "status = __c.s or {}; source_time = __c.t or {}; prev = __c.p; now = __c.n; "
    "local __v, __s = (function() ";

inline constexpr std::string_view kSuffix =
    "\nend)(); if __c.ks then return {['\\0v'] = __v, ['\\0s'] = __s, ['\\0st'] = state} end; "
    "if __s ~= nil then return {['\\0v'] = __v, ['\\0s'] = __s} end; return __v";

inline std::string wrap_script(std::string_view user) {
  std::string s;
  s.reserve(kPrelude.size() + user.size() + kSuffix.size());
  s += kPrelude;
  s += user;
  s += kSuffix;
  return s;
}

}  // namespace outrun::tags::detail
