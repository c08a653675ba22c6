def format_price(cents):
    """An amount in cents as dollars: 1250 -> "$12.50"."""
    return "${}.{:02d}".format(cents // 100, cents % 100)
