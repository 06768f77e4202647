// The MLAFUZZ_* settings accessor (core/settings.h): names from the one table, values
// checked against the variable's type, errors that name the variable; --help-env lists them all.
#include "core/settings.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <stdexcept>
#include <string>

namespace mlafuzz {
namespace {

// Sets a variable for the scope's length.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name(name) { ::setenv(name, value, 1); }
  ~ScopedEnv() { ::unsetenv(name); }
  const char* name;
};

TEST(Settings, ANameNotInTheTableIsALogicError) {
  const std::string name = std::string("MLAFUZZ_") + "NO_SUCH_SETTING";
  EXPECT_THROW(settings::text(name), std::logic_error);
}

TEST(Settings, FlagsReadOneOrZeroAndUnsetIsTheFallback) {
  EXPECT_TRUE(settings::flag("MLAFUZZ_TEST_OVERLAP", true));
  {
    const ScopedEnv e("MLAFUZZ_TEST_OVERLAP", "0");
    EXPECT_FALSE(settings::flag("MLAFUZZ_TEST_OVERLAP", true));
  }
  {
    const ScopedEnv e("MLAFUZZ_TEST_OVERLAP", "on");
    EXPECT_TRUE(settings::flag("MLAFUZZ_TEST_OVERLAP", false));
  }
  {
    const ScopedEnv e("MLAFUZZ_TEST_OVERLAP", "");  // empty: unset
    EXPECT_FALSE(settings::flag("MLAFUZZ_TEST_OVERLAP", false));
  }
}

TEST(Settings, AValueOfTheWrongTypeIsAnErrorNamingTheVariable) {
  const ScopedEnv a("MLAFUZZ_TEST_OVERLAP", "maybe");
  const ScopedEnv b("MLAFUZZ_PYTHON_TIMEOUT", "0");
  const ScopedEnv c("MLAFUZZ_PROPERTY_CASES", "12x");
  const auto message = [](auto read) {
    try {
      read();
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message([] {
              settings::flag("MLAFUZZ_TEST_OVERLAP", false);
            }).rfind("MLAFUZZ_TEST_OVERLAP='maybe': give 1 or 0", 0),
            0u);
  EXPECT_EQ(message([] {
              settings::seconds("MLAFUZZ_PYTHON_TIMEOUT", 60);
            }).rfind("MLAFUZZ_PYTHON_TIMEOUT='0': give seconds > 0", 0),
            0u);
  EXPECT_EQ(message([] {
              settings::integer("MLAFUZZ_PROPERTY_CASES", 1);
            }).rfind("MLAFUZZ_PROPERTY_CASES='12x': give an integer", 0),
            0u);
}

TEST(Settings, HelpEnvListsEveryVariableWithItsDefault) {
  const std::string text = settings::help_env_text();
  ASSERT_FALSE(settings::all().empty());
  for (const settings::Setting& s : settings::all()) {
    EXPECT_NE(text.find("| `" + s.name + "` | " + s.type + " | "), std::string::npos) << s.name;
  }
  EXPECT_NE(text.find("| `MLAFUZZ_PYTHON_TIMEOUT` | seconds | 60 |"), std::string::npos);
}

}  // namespace
}  // namespace mlafuzz
