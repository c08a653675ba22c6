from tags import with_tag


def test_first():
    assert with_tag("a") == ["a"]


def test_second():
    assert with_tag("b") == ["b"]
