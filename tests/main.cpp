// The test binaries' main: doctest's, plus one check. CTest runs each test case as
// `--test-case=<name>` (doctest_discover_tests). A filter that matches no test case passes
// having run nothing -- which is what a ';' in a TEST_CASE name did: CMake splits the name there,
// and eight test cases never ran in CI. So a run filtered by name that starts no test case fails.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <atomic>
#include <cstdio>
#include <cstring>

namespace {

std::atomic<int> g_started{0};

struct StartCounter : doctest::IReporter {
  explicit StartCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++g_started; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("start_counter", 1, StartCounter);

}  // namespace

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;  // --help, --list-test-cases, ...
  const char* filter = nullptr;
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--test-case=", 12) == 0 || std::strncmp(argv[i], "-tc=", 4) == 0)
      filter = argv[i];
  if (filter && g_started.load() == 0) {
    std::fprintf(stderr, "%s matches no test case (a ';' in a TEST_CASE name?)\n", filter);
    return rc != 0 ? rc : 1;
  }
  return rc;
}
