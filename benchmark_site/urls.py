from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from accounts.api import ApiTokenViewSet, ObtainApiTokenView
from bugs.api import BugViewSet, ReproducerVersionViewSet, SubmissionViewSet
from evaluation import views as evaluation_views
from evaluation.api import ResultsView
from runners.api import AlarmViewSet, CampaignViewSet, DetectorSubmissionViewSet, DetectorViewSet, RunViewSet
from runners.views import PLOTLY_JS_PATH, plotly_js

from . import health

router = DefaultRouter()
router.register("bugs", BugViewSet, basename="bug")
router.register("reproducer-versions", ReproducerVersionViewSet, basename="reproducer-version")
router.register("submissions", SubmissionViewSet, basename="submission")
router.register("detectors", DetectorViewSet, basename="detector")
router.register("detector-submissions", DetectorSubmissionViewSet, basename="detector-submission")
router.register("campaigns", CampaignViewSet, basename="campaign")
router.register("runs", RunViewSet, basename="run")
router.register("alarms", AlarmViewSet, basename="alarm")
router.register("tokens", ApiTokenViewSet, basename="token")

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("healthz/ready", health.ready, name="healthz-ready"),
    path("", evaluation_views.home, name="home"),
    path("", include("bugs.urls")),
    path("", include("runners.urls")),
    path("results/", include("evaluation.urls")),
    path("sensitivity/", include("sensitivity.urls")),
    path("leaderboard/", evaluation_views.leaderboard, name="leaderboard"),
    path("leaderboard/entries.<slug:fmt>", evaluation_views.leaderboard_entries_download, name="leaderboard-entries"),
    path("leaderboard/entries/<int:pk>/", evaluation_views.leaderboard_entry, name="leaderboard-entry"),
    path("leaderboard/detectors/<slug:name>/", evaluation_views.leaderboard_detector, name="leaderboard-detector"),
    path("detectors/<slug:name>/", evaluation_views.detector, name="detector"),
    path("methodology/", evaluation_views.methodology, name="methodology"),
    path("methodology/cite.bib", evaluation_views.citation_bib, name="citation_bib"),
    path("docs/", include("core.urls")),
    path("api/", include(router.urls)),
    path("api/results/", ResultsView.as_view(), name="api-results"),
    path("api/token/", ObtainApiTokenView.as_view(), name="api-token"),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # Under the Content-Security-Policy: the split view serves its start-up script as a file of its own, and
    # templates/api_docs.html gives its style sheet the nonce.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema", template_name="api_docs.html"),
         name="api-docs"),
    path("", include("accounts.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("admin/", admin.site.urls),
    path(PLOTLY_JS_PATH, plotly_js, name="plotly-js"),
]
