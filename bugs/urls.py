from django.urls import path

from . import views

app_name = "bugs"
urlpatterns = [
    path("", views.BugListView.as_view(), name="list"),
    path("bugs/<str:bug_id>/", views.bug_detail, name="detail"),
    path("pipelines/", views.pipeline_list, name="pipelines"),
    path("pipelines/<slug:name>/", views.pipeline_detail, name="pipeline"),
]
