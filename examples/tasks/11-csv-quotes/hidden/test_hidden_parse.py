from parse import parse_line


def test_empty_field():
    assert parse_line("x,,z") == ["x", "", "z"]


def test_two_quoted():
    assert parse_line('"a,b","c,d"') == ["a,b", "c,d"]
