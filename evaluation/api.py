import json

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from .tables import detection_table, false_positive_table
from .views import selected_runs


class ResultsView(APIView):
    """The evaluation tables (same numbers as the results page and the exports)."""

    @extend_schema(parameters=[OpenApiParameter("campaign", int, description="Only runs of this campaign")],
                   responses={200: dict})
    def get(self, request):
        runs = selected_runs(request)
        return Response({
            "detection": json.loads(detection_table(runs).to_json(orient="records")),
            "false_positives": json.loads(false_positive_table(runs).to_json(orient="records")),
        })
