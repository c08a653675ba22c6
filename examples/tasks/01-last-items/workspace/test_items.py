from items import last_items


def test_last_two():
    assert last_items([1, 2, 3, 4], 2) == [3, 4]
