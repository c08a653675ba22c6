from money import format_price


class Cart:
    def __init__(self):
        self.items = []

    def add(self, name, price_cents, quantity=1):
        self.items.append((name, price_cents, quantity))

    def total_cents(self):
        return sum(price * quantity for _, price, quantity in self.items)

    def summary(self):
        return "Total: " + format_price(self.total_cents() / 100)
