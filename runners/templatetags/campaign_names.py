"""``{{ campaign|campaign_name:request.user }}`` and ``{{ command|shown_command:request.user }}``: a campaign's name
and an evaluation's command line as the reader may see them (runners.selectors.shown_name, shown_command);
``campaign|shows_every_run:request.user``: whether the reader sees every run of the campaign (shows_every_run)."""
from django import template

from .. import selectors

register = template.Library()
register.filter("campaign_name", selectors.shown_name)
register.filter("shown_command", selectors.shown_command)
register.filter("shows_every_run", selectors.shows_every_run)
