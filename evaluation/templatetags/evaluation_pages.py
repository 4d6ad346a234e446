"""What other apps' pages show of the evaluation: the catalog's leaderboard box (the catalog app, bugs, must not
import evaluation: the apps depend one way), and the methodology's Markdown blocks as HTML."""
from django import template

from ..leaderboard import build_leaderboard
from ..methodology import inline_html, to_html

register = template.Library()


@register.inclusion_tag("evaluation/leaderboard_box.html", takes_context=True)
def leaderboard_box(context, top=3):
    """The top rows of the latest stored evaluation's leaderboard that the reader may see. Only a stored one: the
    live tables over every run would judge the whole history on each view of the catalog."""
    return {"board": build_leaderboard({}, context["request"].user, stored_only=True), "top": top}


register.filter("as_html", to_html)
register.filter("as_inline_html", inline_html)
