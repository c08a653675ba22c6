from flatten import flatten


def test_empty_lists():
    assert flatten([[], [[]], 1]) == [1]


def test_mixed():
    assert flatten(["x", [1, ["y", [2]]]]) == ["x", 1, "y", 2]
