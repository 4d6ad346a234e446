"""A password change revokes the account's API tokens, by whatever path it happens: the password change and
reset pages, the admin, ``manage.py changepassword``. Django tells every configured password validator of
each change (``password_validation.password_changed``, called as a user is saved after ``set_password``), so
this listens there; it checks nothing. Re-hashing a password at sign-in is not a change and does not call it."""
from .actions import do_revoke_api_tokens_of


class RevokeApiTokensOnPasswordChange:
    def validate(self, password, user=None):
        """Every password passes: this validator only listens."""

    def password_changed(self, password, user=None):
        if user is not None and user.pk is not None:
            do_revoke_api_tokens_of(user, acting_user=None)  # the system, on whoever changed it

    def get_help_text(self):
        return "Changing the password revokes the account's API tokens."
