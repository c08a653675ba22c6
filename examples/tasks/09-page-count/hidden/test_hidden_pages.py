from paging import page_count


def test_exact_and_empty():
    assert page_count(20, 10) == 2
    assert page_count(0, 10) == 0
    assert page_count(1, 10) == 1
