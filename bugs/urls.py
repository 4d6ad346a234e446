from django.urls import path

from . import submission_views, views
from .exports import catalog_export

app_name = "bugs"
urlpatterns = [
    path("catalog/", views.BugListView.as_view(), name="list"),
    path("catalog.<slug:fmt>", catalog_export, name="export"),
    path("bugs/<str:bug_id>/", views.bug_detail, name="detail"),
    path("bugs/<str:bug_id>/submit/", submission_views.resubmit, name="resubmit"),
    path("bugs/<str:bug_id>/held-out/", views.bug_held_out, name="held_out"),
    path("submit/", submission_views.submit_bug, name="submit"),
    path("submissions/mine/", submission_views.my_submissions, name="my_submissions"),
    path("review/", submission_views.review_queue, name="review_queue"),
    path("review/<int:pk>/", submission_views.review_version, name="review"),
    path("pipelines/", views.pipeline_list, name="pipelines"),
    path("pipelines/<slug:name>/", views.pipeline_detail, name="pipeline"),
]
