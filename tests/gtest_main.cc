// The main() of every GoogleTest executable here: GoogleTest's, except that a run in which nothing
// passed or failed and something was skipped (no GPU, a backend not built in, no network
// namespaces) exits with 77, which CTest reports as "Skipped" (SKIP_RETURN_CODE) rather than
// "Passed". A run with any failure still fails; a run with any pass passes, with its skips listed
// by GoogleTest.
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const ::testing::UnitTest& run = *::testing::UnitTest::GetInstance();
  if (rc == 0 && run.successful_test_count() == 0 && run.failed_test_count() == 0 &&
      run.skipped_test_count() > 0) {
    return 77;
  }
  return rc;
}
