from django.urls import path

from . import views
from .exports import catalog_export

app_name = "bugs"
urlpatterns = [
    path("", views.BugListView.as_view(), name="list"),
    path("catalog.<slug:fmt>", catalog_export, name="export"),
    path("bugs/<str:bug_id>/", views.bug_detail, name="detail"),
    path("pipelines/", views.pipeline_list, name="pipelines"),
    path("pipelines/<slug:name>/", views.pipeline_detail, name="pipeline"),
]
