from people import by_age


def test_sorted_by_age():
    people = [("ann", 31), ("bob", 25), ("cid", 40)]
    assert by_age(people) == [("bob", 25), ("ann", 31), ("cid", 40)]
