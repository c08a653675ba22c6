from cart import Cart
from money import format_price


def test_format_price():
    assert format_price(1250) == "$12.50"


def test_summary():
    cart = Cart()
    cart.add("pen", 250, quantity=3)
    cart.add("pad", 500)
    assert cart.summary() == "Total: $12.50"
