import json

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.exceptions import NotFound as NotFoundError
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from .filters import OUTCOMES
from .models import Device
from .results import TABLES, NotFound, Results, shown_once


class ResultsView(APIView):
    """The evaluation tables (same numbers as the results page and the exports, for the same query)."""

    @extend_schema(parameters=[
        OpenApiParameter("evaluation", int, description="Stored tables of this evaluation, CPU or GPU (default: "
                                                        "the latest of ?device=)"),
        OpenApiParameter("campaign", int, description="Live tables over the runs of this campaign"),
        OpenApiParameter("device", str, enum=Device.values,
                         description="Without an evaluation or campaign: the latest evaluation that ran on cpu (the "
                                     "default) or gpu"),
        OpenApiParameter("detector", str, many=True, description="Only these detectors"),
        OpenApiParameter("bug", str, many=True, description="Only these bugs (IDs)"),
        OpenApiParameter("framework", str, description="Only bugs of this framework"),
        OpenApiParameter("fault_location", str, description="Only bugs whose fault lives here"),
        OpenApiParameter("outcome", str, description="Only detection rows with this outcome: "
                                                     + ", ".join(OUTCOMES)),
    ], responses={200: dict})
    def get(self, request):
        return Response(shown_once(request, "api-results", lambda: self.body(request)))

    def body(self, request):
        try:
            results = Results(request.query_params, request.user)
        except NotFound as error:
            raise NotFoundError(str(error)) from error
        if results.errors:
            raise ValidationError(results.errors.get_json_data())
        evaluation = results.evaluation
        body = {"evaluation": evaluation.pk if evaluation else None,
                "device": evaluation.device if evaluation else None,  # where its runs ran: cpu or gpu
                "environment": evaluation.environment if evaluation else None}
        for name, (key, _, _) in TABLES.items():
            body[key] = json.loads(results.table(name).to_json(orient="records"))
        return body
