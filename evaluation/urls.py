from django.urls import path

from . import views

app_name = "evaluation"
urlpatterns = [
    path("", views.results, name="results"),
    path("compare/", views.compare, name="compare"),
    path("compare.<slug:fmt>", views.compare_export, name="compare-export"),
    path("<slug:table>.<slug:fmt>", views.export_table, name="export"),
]
