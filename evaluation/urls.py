from django.urls import path

from . import views

app_name = "evaluation"
urlpatterns = [
    path("", views.results, name="results"),
    path("<slug:table>.<slug:fmt>", views.export_table, name="export"),
]
