from tags import with_tag


def test_given_list():
    assert with_tag("y", ["x"]) == ["x", "y"]


def test_fresh_every_time():
    assert with_tag("c") == ["c"]
    assert with_tag("d") == ["d"]
