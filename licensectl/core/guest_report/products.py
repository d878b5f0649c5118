"""Product names onto a fixed, small set of metric-safe labels, and the check of a held product
against what a class's FeatureType implies (docs/design.md#feature-type). Separate from parsing: no
parser uses it; the controllers apply it to an evaluated guest's product.
"""

from __future__ import annotations

from typing import Final

from licensectl.core.guest_report.bounded_text import _SPACES

# Metric-safe product labels: the free-text product collapses onto a fixed, small set.
_PRODUCT_LABELS: Final = {
    "nvidia rtx virtual workstation": "vws",
    "nvidia virtual pc": "vpc",
    "nvidia virtual applications": "vapps",
    "nvidia virtual compute server": "vcs",
    "nvidia ai enterprise": "nvaie",
}
PRODUCT_LABELS: Final = frozenset({*_PRODUCT_LABELS.values(), "other", "none"})


def product_label(product: str | None) -> str:
    """A bounded label for metrics: one of PRODUCT_LABELS, never the free text itself."""
    if not product:
        return "none"
    return _PRODUCT_LABELS.get(_SPACES.sub(" ", product).strip().lower(), "other")


# What a class's FeatureType implies the guest must hold (docs/design.md#feature-type): 2 is RTX
# Virtual Workstation, 4 Virtual Compute Server (NVIDIA AI Enterprise is the same compute pool).
# FeatureType 1 lets gridd pick the product from the vGPU type, so the class implies nothing and
# no guest of such a class is ever judged wrong; 0 (unlicensed) implies nothing either.
_IMPLIED_PRODUCTS: Final[dict[int, frozenset[str]]] = {2: frozenset({"vws"}), 4: frozenset({"vcs", "nvaie"})}


def implied_products(feature_type: int | None) -> frozenset[str] | None:
    """Product labels a guest of a class with this FeatureType may hold; None: cannot tell."""
    return None if feature_type is None else _IMPLIED_PRODUCTS.get(feature_type)


def wrong_product(product: str | None, feature_type: int | None) -> bool | None:
    """True when the guest holds another product than its class implies (it draws from the wrong,
    possibly dearer, license pool); None when the class implies nothing or no product is held."""
    allowed = implied_products(feature_type)
    held = product_label(product)
    if allowed is None or held == "none":
        return None
    return held not in allowed
