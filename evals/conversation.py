"""Evals of the conversation object (``LLM``): multi-step tool use, where each call needs
what the previous one returned (the BuildMulti eval of Dagger's evaluator,
https://docs.dagger.io/features/llm, in miniature)."""

from __future__ import annotations

from runtime import LLM
from runtime.evals import Eval, tool_calls

SKUS = {"blue mug": "MUG-BLUE-01", "red mug": "MUG-RED-02"}
PRICES = {"MUG-BLUE-01": "12.50 EUR", "MUG-RED-02": "9.00 EUR"}
STOCK = {"MUG-BLUE-01": 12, "MUG-RED-02": 0}


class Inventory:
    """A shop's inventory: products are found by name, then priced and counted by SKU."""

    def find_product(self, name: str) -> str:
        """The SKU of a product, by its name (e.g. 'red mug')."""
        sku = SKUS.get(name.strip().casefold())
        if sku is None:
            raise ValueError(f"no product called {name!r}; products: {', '.join(SKUS)}")
        return sku

    def price(self, sku: str) -> str:
        """The unit price of a SKU."""
        if sku not in PRICES:
            raise ValueError(f"unknown SKU {sku!r}: find it with find_product first")
        return PRICES[sku]

    def stock(self, sku: str) -> int:
        """How many of a SKU are in stock."""
        if sku not in STOCK:
            raise ValueError(f"unknown SKU {sku!r}: find it with find_product first")
        return STOCK[sku]


class MultiStepTools(Eval):
    name = "multi-step-tools"

    def prompt(self, base: LLM) -> LLM:
        return (base.with_tools(Inventory())
                .with_prompt("What do 3 blue mugs cost in total, and are there enough in "
                             "stock? Find the product's SKU first, then look up its price "
                             "and stock.")
                .loop(max_steps=8))

    def check(self, llm: LLM) -> None:
        calls = tool_calls(llm)
        names = [c.name for c in calls if not c.is_error]
        assert "find_product" in names, f"never found the SKU (calls: {names})"
        priced = [c for c in calls if c.name == "price" and not c.is_error]
        assert priced and priced[0].input.get("sku") == "MUG-BLUE-01", \
            f"should have priced MUG-BLUE-01, the SKU find_product gave (calls: {names})"
        assert "stock" in names, f"never checked the stock (calls: {names})"
        reply = (llm.last_reply or "").replace(",", ".")
        assert "37.5" in reply, f"3 x 12.50 is 37.50; the reply says: {llm.last_reply!r}"
