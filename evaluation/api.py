import json

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from .views import TABLES, selection, table_frame


class ResultsView(APIView):
    """The evaluation tables (same numbers as the results page and the exports)."""

    @extend_schema(parameters=[
        OpenApiParameter("evaluation", int, description="Stored tables of this evaluation (default: the latest)"),
        OpenApiParameter("campaign", int, description="Live tables over the runs of this campaign"),
    ], responses={200: dict})
    def get(self, request):
        evaluation, runs = selection(request)
        body = {"evaluation": evaluation.pk if evaluation else None}
        for name, (key, _, _) in TABLES.items():
            body[key] = json.loads(table_frame(name, evaluation, runs).to_json(orient="records"))
        return Response(body)
