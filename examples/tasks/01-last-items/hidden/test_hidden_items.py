from items import last_items


def test_last_one():
    assert last_items(["a", "b", "c"], 1) == ["c"]


def test_all_of_them():
    assert last_items([5, 6, 7], 3) == [5, 6, 7]
