from geometry import distance


def test_three_four_five():
    assert distance((0, 0), (3, 4)) == 5.0
