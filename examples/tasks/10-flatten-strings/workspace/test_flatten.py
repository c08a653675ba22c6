from flatten import flatten


def test_numbers():
    assert flatten([1, [2, [3]], 4]) == [1, 2, 3, 4]


def test_strings_stay_whole():
    assert flatten(["ab", ["cd"]]) == ["ab", "cd"]
