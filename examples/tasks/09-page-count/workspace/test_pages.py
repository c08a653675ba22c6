from paging import page_count


def test_partial_last_page():
    assert page_count(25, 10) == 3
