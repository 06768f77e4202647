"""The MLAFUZZ_* settings accessor (python/mlafuzz/_settings.py): names from the one table, values
checked against the variable's type, errors that name the variable."""

import pytest

from mlafuzz import _settings


def test_a_name_not_in_the_table_is_refused() -> None:
    name = "MLAFUZZ_NO_SUCH_SETTING"
    with pytest.raises(KeyError, match=f"{name} is not in the settings table"):
        _settings.text(name, {})


@pytest.mark.parametrize("value, expected", [("1", True), ("0", False), ("off", False),
                                             ("Yes", True), ("", True)])
def test_a_flag_reads_one_or_zero_and_unset_is_the_fallback(value: str, expected: bool) -> None:
    assert _settings.flag("MLAFUZZ_TORCH_PINNED", True, {"MLAFUZZ_TORCH_PINNED": value}) == expected


@pytest.mark.parametrize("name, reader", [("MLAFUZZ_TORCH_PINNED", _settings.flag),
                                          ("MLAFUZZ_WORKER_PARENT", _settings.integer)])
def test_a_value_of_the_wrong_type_is_an_error_naming_the_variable(name, reader) -> None:
    with pytest.raises(ValueError, match=f"^{name}='maybe': give "):
        reader(name, 0, {name: "maybe"})


def test_every_entry_has_the_fields_help_env_prints() -> None:
    for s in _settings.table():
        assert s["name"].startswith("MLAFUZZ_"), s
        assert s["scope"] in ("run", "device", "internal", "test", "script"), s
        assert s["type"] and s["description"] and s["reader"], s
