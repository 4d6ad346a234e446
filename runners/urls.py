from django.urls import path

from . import views
from .detector_versions import views as detector_views

app_name = "runners"
urlpatterns = [
    path("runs/<int:pk>/", views.run_detail, name="run"),
    path("runs/<int:pk>/record.json", views.run_record, name="run_record"),
    path("campaigns/", views.campaign_list, name="campaigns"),
    path("workers/", views.workers, name="workers"),
    path("campaigns/new/", views.campaign_new, name="campaign_new"),
    path("campaigns/<int:pk>/", views.campaign_detail, name="campaign"),
    path("campaigns/<int:pk>/live/", views.campaign_live, name="campaign_live"),
    path("campaigns/<int:pk>/cancel/", views.campaign_cancel, name="campaign_cancel"),
    path("campaigns/<int:pk>/retry/", views.campaign_retry, name="campaign_retry"),
    path("detectors/submit/", detector_views.submit_detector, name="submit_detector"),
    path("detectors/mine/", detector_views.my_detectors, name="my_detectors"),
    path("detectors/review/", detector_views.detector_review_queue, name="detector_review_queue"),
    path("detectors/review/<int:pk>/", detector_views.review_detector, name="review_detector"),
]
