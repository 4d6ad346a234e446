from django.contrib.auth import authenticate
from django.core.exceptions import ValidationError as DjangoValidationError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from .actions import do_create_api_token, do_revoke_api_token
from .models import ApiToken, username_max_length
from .permissions import NotByApiToken


class ApiTokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at", "revoked_at"]
        read_only_fields = ["prefix", "created_at", "last_used_at", "revoked_at"]


class NewApiTokenSerializer(ApiTokenSerializer):
    token = serializers.CharField(read_only=True, help_text="The secret. Shown only in this response.")

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


def create_token(user, name):
    try:
        token, secret = do_create_api_token(name, acting_user=user)
    except DjangoValidationError as error:
        raise ValidationError({"name": error.messages})
    token.token = secret
    return Response(NewApiTokenSerializer(token).data, status=status.HTTP_201_CREATED)


class ApiTokenViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, mixins.CreateModelMixin,
                      mixins.DestroyModelMixin, viewsets.GenericViewSet):
    """Your API tokens. Creating one (signed in, not with a token) returns its secret once; DELETE or
    POST .../revoke/ revokes it (the record stays, marked revoked)."""

    serializer_class = ApiTokenSerializer
    permission_classes = [permissions.IsAuthenticated]

    def get_permissions(self):
        if self.action == "create":
            return [*super().get_permissions(), NotByApiToken()]
        return super().get_permissions()

    def get_queryset(self):
        if getattr(self, "swagger_fake_view", False):  # schema generation has no user
            return ApiToken.objects.none()
        return ApiToken.objects.filter(user=self.request.user)

    @extend_schema(responses={201: NewApiTokenSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return create_token(request.user, serializer.validated_data["name"])

    def destroy(self, request, *args, **kwargs):
        do_revoke_api_token(self.get_object(), acting_user=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses=ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request, pk=None):
        return Response(ApiTokenSerializer(do_revoke_api_token(self.get_object(), acting_user=request.user)).data)


class CredentialsSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=username_max_length())
    password = serializers.CharField(style={"input_type": "password"}, trim_whitespace=False, write_only=True)
    name = serializers.CharField(required=False, default="API token", max_length=100)


class ObtainApiTokenView(APIView):
    """Exchange a username and password for a new named API token (the secret is in ``token``). Failed
    attempts count against the account and the client address (django-axes): past the limit, 429."""

    authentication_classes = []
    permission_classes = [permissions.AllowAny]
    throttle_scope = "token"  # a password check: no unlimited guessing (and the anonymous rate too)

    @extend_schema(request=CredentialsSerializer, responses={201: NewApiTokenSerializer})
    def post(self, request):
        credentials = CredentialsSerializer(data=request.data)
        credentials.is_valid(raise_exception=True)
        user = authenticate(request._request, username=credentials.validated_data["username"],
                            password=credentials.validated_data["password"])
        if user is None:
            raise ValidationError({"non_field_errors": ["Unable to log in with the provided credentials."]})
        return create_token(user, credentials.validated_data["name"])
