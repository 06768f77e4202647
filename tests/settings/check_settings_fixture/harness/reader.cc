// A fixture for scripts/check_settings.py (tests/settings): one listed variable read through the
// accessor, one read with getenv, one not listed.
bool listed() { return mlafuzz::settings::flag("MLAFUZZ_LISTED", false); }
const char* direct() { return std::getenv("MLAFUZZ_LISTED"); }
bool unlisted() { return mlafuzz::settings::flag("MLAFUZZ_UNLISTED", false); }
