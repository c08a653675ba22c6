from geometry import distance


def test_same_point():
    assert distance((2, 2), (2, 2)) == 0.0


def test_negative():
    assert distance((-1, -1), (2, 3)) == 5.0
