from people import by_age


def test_ties_by_name():
    people = [("zoe", 30), ("amy", 30), ("kim", 20)]
    assert by_age(people) == [("kim", 20), ("amy", 30), ("zoe", 30)]


def test_empty():
    assert by_age([]) == []
