"""``{% cached_fragment "name" part ... %}…{% endcached_fragment %}``: the enclosed part of a template, rendered once
for the same parts (core.caching). A part is a plain value, or a model instance or list of them, named by what was
read of it (``core.caching.loaded_state``: its fields, the attributes set on it, the objects read with it); a part
that is None (what may still change) renders the fragment every time. The parts must name everything the fragment
shows, and the fragment must show nothing of the reader (no name, CSRF token or nonce): every reader with the same
parts is served the same HTML."""
from django import template

from ..caching import cached, digest, loaded_state

register = template.Library()


@register.tag
def cached_fragment(parser, token):
    parts = token.split_contents()[1:]
    if not parts:
        raise template.TemplateSyntaxError("cached_fragment needs a name, then what the fragment shows.")
    nodelist = parser.parse(("endcached_fragment",))
    parser.delete_first_token()
    return CachedFragment(nodelist, [parser.compile_filter(part) for part in parts])


class CachedFragment(template.Node):
    def __init__(self, nodelist, parts):
        self.nodelist, self.parts = nodelist, parts

    def render(self, context):
        parts = [part.resolve(context) for part in self.parts]
        key = None if any(part is None for part in parts) else f"fragment:{digest(loaded_state(parts))}"
        return cached(key, lambda: self.nodelist.render(context))
