def page_count(total, per_page):
    """Pages needed for total items, per_page on each."""
    return total // per_page
