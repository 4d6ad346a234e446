from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiTokenScheme(OpenApiAuthenticationExtension):
    target_class = "accounts.authentication.ApiTokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A named API token from /account/tokens/ or POST /api/token/, sent as "
                           "`Authorization: Bearer <secret>` (or `Authorization: Token <secret>`).",
        }
